"""A web dashboard for asyncq (extra ``asyncq[dashboard]``): queues, jobs by state, a
job's detail, throughput, and requeue / cancel / pause / resume. Run it with
``asyncq dashboard MODULE:APP``, or mount `create_app` into a Starlette or FastAPI
service. Importing this package needs Starlette and Jinja2; asyncq itself never does."""

from asyncq.dashboard.app import create_app
from asyncq.dashboard.guard import Authorize

__all__ = ["Authorize", "create_app"]
