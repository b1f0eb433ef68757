"""``corral serve``'s REST API: FastAPI routes, thin over :mod:`corral.service`.

:func:`corral.api.app.create_app` builds the app; every route but ``/healthz``
needs ``Authorization: Bearer <token>`` (:mod:`corral.api.auth`); errors have
one JSON shape (:mod:`corral.api.errors`).
"""
