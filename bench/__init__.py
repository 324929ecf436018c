"""The project's benchmark (SPEC §12): ``python -m bench`` or ``make bench``.

Every figure is measured in one run on fresh databases and topics, and every throughput is
reported next to a baseline measured in the same run, because the machine is shared.
"""
