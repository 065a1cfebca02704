"""A small shop served by gunicorn in the WSGI tests: a Django project with Django REST
framework views (``settings``, ``urls``, ``views``) and a Flask app (``flask_app``). The
files that ``docs/http-endpoints.md`` shows are checked to hold its examples verbatim."""
