"""Benchmarks: asyncq against procrastinate, PgQueuer and plain SQL on one PostgreSQL.

Run ``python -m benchmarks.run --help``; see benchmarks/README.md.
"""
