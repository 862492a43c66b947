# One image for every service; the command picks the service:
#   python -m services.ingest --host 0.0.0.0 --port 18400 | services.projector |
#   services.scheduler | services.completions | services.worker | services.stack setup
# Built by docker-compose.yml; deploy/k8s runs the same image from a registry.

# The worker's process spawner (services/worker/spawner), built where a compiler is: the image
# itself has none. The worker finds it beside the Python that runs it.
FROM python:3.11-slim AS spawner
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
COPY services/worker/spawner/hs_spawner.c /tmp/
RUN gcc -O2 -Wall -Wextra -Werror -o /tmp/hs-spawner /tmp/hs_spawner.c

FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# The pinned runtime dependencies first, in their own layer: editing the code does not reinstall
# them. They are read from pyproject.toml (exact pins there), so there is one list.
COPY pyproject.toml README.md ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
    && pip install --no-compile -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

COPY core core
COPY schemas schemas
COPY services services
COPY sql sql
COPY --from=spawner /tmp/hs-spawner /usr/local/bin/hs-spawner
# Then fail the build, rather than a page at run time, if the installed package lacks a data
# file of the source (templates, migrations: [tool.setuptools.package-data] in pyproject.toml).
RUN pip install --no-deps --no-compile . \
    && cd / && python -c "import services.ingest.app, services.projector.app, services.scheduler.service, services.completions.service, services.worker.service, sql.migrate" \
    && python -c "import pathlib, sysconfig; src = pathlib.Path('/app'); site = pathlib.Path(sysconfig.get_paths()['purelib']); missing = [str(p.relative_to(src)) for d in ('core', 'schemas', 'services', 'sql') for p in (src / d).rglob('*') if p.is_file() and p.suffix not in ('.py', '.pyc') and p.name != 'README.md' and not (site / p.relative_to(src)).exists()]; assert not missing, f'not installed, add them to [tool.setuptools.package-data] in pyproject.toml: {missing}'"

# A non-root user with a numeric id (Kubernetes' runAsNonRoot can only verify numeric ids).
# /var/lib/hailstream is its data directory (instance logs of the local driver, scratch);
# /var/lib/hailstream-shared is where compose mounts the spec and job-log volume that ingest and
# the workers share. Both exist in the image, owned by the user, so a named volume mounted there
# starts with that ownership.
RUN groupadd --system --gid 10001 hailstream \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/hailstream \
        --shell /usr/sbin/nologin hailstream \
    && mkdir -p /var/lib/hailstream /var/lib/hailstream-shared \
    && chown 10001:10001 /var/lib/hailstream /var/lib/hailstream-shared

ENV HS_DATA_DIR=/var/lib/hailstream
USER 10001:10001
WORKDIR /var/lib/hailstream

EXPOSE 18400
# Idempotent and one-shot: create missing topics, apply migrations (see deploy/README.md).
CMD ["python", "-m", "services.stack", "setup"]
