"""The harness of the tests that run real worker processes (tests/acceptance and
tests/faults): one task app (`tests.harness.app`), one ledger written by its tasks
(`tests.harness.ledger`), one launcher of worker processes and CLI commands
(`tests.harness.processes`), helpers for the jobs table (`tests.harness.jobs`), and
the waits for a condition that every suite uses instead of sleeping (`tests.harness.waiting`)."""
