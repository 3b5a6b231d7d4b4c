"""The entry point: `app`, the Flask application (any WSGI server), and `asgi`, what gunicorn serves.

`asgi` (controlplane.asgi.Front) answers inference requests on the event loop of Flightdeck's
gunicorn worker (controlplane.worker) and hands everything else to `app`.
"""

from controlplane.app import create_app
from controlplane.asgi import Front

app = create_app()
asgi = Front(app)
