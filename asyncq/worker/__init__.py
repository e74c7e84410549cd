"""The worker runtime: one service per responsibility, wired by the supervisor.

- ``listener``: the dedicated LISTEN connection that wakes the producer
- ``producer``: claims batches sized to free slots
- ``executor``: runs one job and decides its outcome
- ``completer``: writes outcomes in batches, fenced by attempt
- ``heartbeat``: renews the leases of every job this worker holds
- ``reaper``: returns jobs with expired leases, prunes old done rows
"""
