# One image for every process of Pilot Status (web, workers, beat, relay, consumer, simulator);
# docker-compose.yml picks the command. Configuration comes only from the environment
# (contract §7); nothing secret is baked in.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DJANGO_SETTINGS_MODULE=pilot_status.settings \
    PORT=8000

WORKDIR /app

# Dependencies first: this layer is rebuilt only when requirements.txt changes.
# (psycopg[binary] ships its own libpq: no system packages needed.)
COPY requirements.txt .
RUN pip install -r requirements.txt

COPY . .
RUN useradd --system --uid 10001 --home-dir /app app \
    && mkdir -p /app/.state \
    && chown app:app /app/.state
USER app

EXPOSE 8000
CMD ["sh", "-c", "exec gunicorn pilot_status.wsgi:application -b 0.0.0.0:${PORT} -w ${WEB_CONCURRENCY:-$(nproc)} --timeout 30 --graceful-timeout 20 --keep-alive 5 --access-logfile -"]
