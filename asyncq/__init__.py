"""asyncq: an asyncio task queue on the PostgreSQL you already run."""

from asyncq.app import App
from asyncq.errors import (
    AppNotOpen,
    ArgumentsError,
    AsyncqError,
    ConfigurationError,
    DatabaseUnavailable,
    InvalidName,
    NotInJob,
    PayloadTooLarge,
    SchemaNotMigrated,
    TaskArgumentsMismatch,
    TaskNotFound,
)
from asyncq.job import JobContext, RequeueResult, Status, current_job
from asyncq.retry import Backoff
from asyncq.task import Deferrer, Task
from asyncq.worker.supervisor import WorkerStats

__version__ = "0.1.0"

__all__ = [
    "App",
    "AppNotOpen",
    "ArgumentsError",
    "AsyncqError",
    "Backoff",
    "ConfigurationError",
    "DatabaseUnavailable",
    "Deferrer",
    "InvalidName",
    "JobContext",
    "NotInJob",
    "PayloadTooLarge",
    "RequeueResult",
    "SchemaNotMigrated",
    "Status",
    "Task",
    "TaskArgumentsMismatch",
    "TaskNotFound",
    "WorkerStats",
    "__version__",
    "current_job",
]
