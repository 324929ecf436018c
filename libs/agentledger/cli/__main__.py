"""``python -m agentledger.cli``: the same front door as the ``agentledger`` script."""

from agentledger.cli import main

main()
