"""moto's Kinesis and DynamoDB emulator as a WSGI app, for an HTTP/2-capable server (hypercorn):
the KCL's Kinesis client speaks cleartext HTTP/2, which moto's own server does not."""

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

app = DomainDispatcherApplication(create_backend_app)
