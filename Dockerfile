# One image for every service; the command picks the service. Built by docker-compose.yml.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY core core
COPY schemas schemas
COPY services services
COPY sql sql
RUN pip install --no-cache-dir .
ENV PYTHONUNBUFFERED=1
CMD ["python", "-m", "sql.migrate"]
