"""The worker runtime: one module per concern, composed by the supervisor.

- ``settings``: every worker option, its default and bounds, written once
- ``supervisor``: checks the database, starts the services, runs shutdown in order
- ``services``: how a service runs, and the one retry-with-backoff helper they share
- ``listener``: the dedicated LISTEN connection; wakes the claim loops, also when a job
  comes due (``wakeup``)
- ``aborts``: without a LISTEN connection (``App(listen=False)``), the cancels of the
  running attempts looked for every poll interval
- ``producer``: the claim loops, batches sized to the free ``slots``
- ``dispatch``: the runners and the attempts this worker holds; stops an attempt (lease
  lost, timeout, shutdown) and nothing else
- ``executor``: one attempt: the task, its decoded arguments, the middleware chain
- ``outcomes``: what an attempt's end means for its job, a pure decision
- ``completer``: writes outcomes in batches, fenced by claim
- ``heartbeat``: renews the lease of every job this worker holds
- ``maintenance``: what one worker at a time does, behind one advisory-lock gate: the
  ``rescuer`` (expired leases) and the ``pruner`` (old done rows)
- ``pool_check``: the idle connections of the App's pool tested now and then
- ``observer``: the worker's events; logging and the returned counts listen to them
"""
