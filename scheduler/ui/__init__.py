"""The web dashboard at `/ui`: server-rendered pages (Jinja2, with htmx vendored as package data).

Modules: `session` (sign-in with an API token, the signed session cookie, CSRF tokens), `figures`
(what the overview shows, read from the store), `cronwords` (a cron expression in words), `pages`
(the routes). Templates and static files are package data; nothing is fetched from elsewhere, so
the dashboard works offline. Importing this package imports no web framework.
"""
