"""The web page of ``corral serve``: server-rendered shells (Jinja2) and a little of
our own JavaScript that talks to the same REST API as every other client
(``fetch`` for actions, ``EventSource`` for live updates). No build step, no CDN:
everything it needs is served from ``/static``.
"""
