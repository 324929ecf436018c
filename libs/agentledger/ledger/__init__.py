"""The command ledger: every rule about admitting, claiming and finalizing commands lives here."""
