"""asyncq: an asyncio task queue on the PostgreSQL you already run."""

from asyncq.admin import RequeueResult, ScheduleInfo, WorkerState
from asyncq.app import App
from asyncq.control import Discard, JobControl, Retry, Snooze
from asyncq.errors import (
    AppNotOpen,
    ArgumentsError,
    AsyncqError,
    ChildFailed,
    ConfigurationError,
    DatabaseUnavailable,
    EventTimeout,
    InvalidName,
    JobCancelled,
    JobFailed,
    JobNotFound,
    NotInJob,
    NotInWorkflow,
    PayloadTooLarge,
    PreparedStatementsRefused,
    SchemaNotMigrated,
    TaskArgumentsMismatch,
    TaskNotFound,
    UndecodableArguments,
)
from asyncq.job import JobContext, Status, current_job
from asyncq.retry import Backoff
from asyncq.schedule import Cron, Schedule
from asyncq.task import Deferrer, SyncTask, Task
from asyncq.worker.executor import Middleware
from asyncq.worker.observer import WorkerStats

__version__ = "0.1.0"

__all__ = [
    "App",
    "AppNotOpen",
    "ArgumentsError",
    "AsyncqError",
    "Backoff",
    "ChildFailed",
    "ConfigurationError",
    "Cron",
    "DatabaseUnavailable",
    "Deferrer",
    "Discard",
    "EventTimeout",
    "InvalidName",
    "JobCancelled",
    "JobContext",
    "JobControl",
    "JobFailed",
    "JobNotFound",
    "Middleware",
    "NotInJob",
    "NotInWorkflow",
    "PayloadTooLarge",
    "PreparedStatementsRefused",
    "RequeueResult",
    "Retry",
    "Schedule",
    "ScheduleInfo",
    "SchemaNotMigrated",
    "Snooze",
    "Status",
    "SyncTask",
    "Task",
    "TaskArgumentsMismatch",
    "TaskNotFound",
    "UndecodableArguments",
    "WorkerState",
    "WorkerStats",
    "__version__",
    "current_job",
]
