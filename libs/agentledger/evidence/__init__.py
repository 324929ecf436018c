"""Evidence an auditor can verify offline (issue 43): a Merkle log per tenant over the audit
ledger, signed checkpoints, and a receipt per operation. See docs/evidence.md."""
