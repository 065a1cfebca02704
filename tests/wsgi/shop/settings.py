"""Settings of the Django shop (``DJANGO_SETTINGS_MODULE=shop.settings``)."""

# settings.py
import os

SETTLE = {
    "url": os.environ.get("SETTLE_REDIS_URL", "redis://localhost:6379/0"),
    "namespace": os.environ.get("SETTLE_NAMESPACE", "payments"),
    "paths": ["/payments"],  # POST and PATCH under these paths need an Idempotency-Key
    "lease": float(os.environ.get("SETTLE_LEASE", "30")),
    # "principal": "shop.auth.tenant_of",  # default: "user:<pk>" of request.user
}
MIDDLEWARE = [
    "django.middleware.common.CommonMiddleware",
    "shop.auth.ApiKeyMiddleware",  # your authentication: it sets request.user
    "settle.django.IdempotencyMiddleware",  # after it: the principal is request.user
]
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["shop.auth.FromMiddleware"],
    "UNAUTHENTICATED_USER": None,
}

# -- the rest of the test project ------------------------------------------------------------

# Counts each run of a guarded view in Redis, and holds it while the test says so.
MIDDLEWARE.append("shop.probe.ProbeMiddleware")
SECRET_KEY = "test-only-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
ROOT_URLCONF = "shop.urls"
INSTALLED_APPS = ["rest_framework"]
DATABASES: dict[str, dict[str, str]] = {}
USE_TZ = True
REST_FRAMEWORK["DEFAULT_RENDERER_CLASSES"] = ["rest_framework.renderers.JSONRenderer"]
