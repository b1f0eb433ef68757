"""The service layer of ``corral serve``: machines, planning, dispatch, the job
manager and its scheduler, over :mod:`corral.job` and :mod:`corral.store`.

Nothing here knows about HTTP: :mod:`corral.api` is a thin layer of routes over
these functions, mapping :class:`~corral.errors.CorralError` and
:class:`ServiceError` to its JSON error shape.
"""
