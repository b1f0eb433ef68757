"""The services one app uses, reached from a route through ``request.app.state``."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from corral.private import private_dir
from corral.service.audit import AuditLog
from corral.service.jobs import JobManager
from corral.service.machines import MachineService
from corral.service.settings import ServerSettings
from corral.service.tasks import TaskService
from corral.service.users import UserService
from corral.store import Store


@dataclass
class Services:
    """The store and every service over it."""

    store: Store
    settings: ServerSettings
    machines: MachineService
    jobs: JobManager
    tasks: TaskService
    users: UserService
    audit: AuditLog

    @classmethod
    def build(cls, store: Store, settings: ServerSettings) -> Services:
        """Wire the services over ``store``; the run dir is made private (0700), so
        another local OS user cannot even list the jobs' directories."""
        private_dir(settings.run_dir)
        machines = MachineService(store, settings)
        jobs = JobManager(store, settings, machines)
        users = UserService(store)
        tasks = TaskService(store, jobs, users)
        return cls(store, settings, machines, jobs, tasks, users, AuditLog(store))


def services(request: Request) -> Services:
    """The app's services (a FastAPI dependency)."""
    found: Services = request.app.state.services
    return found
