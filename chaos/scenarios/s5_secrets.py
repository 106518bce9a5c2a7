"""S5: secrets at rest. API keys are stored only as hashes; webhook tokens are derived from
SECRET_KEY (the environment), Evolution instance tokens only as hashes; none of the raw values handed
out during the run appears in any table or in the stack's logs (run last, after every other row)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection

from ..context import Context

FAULT = "every raw key and token handed out in the run, searched in every table and every stack log"
MUST = "keys and tokens only as hashes or env secrets; none in logs"


def _tables() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        return [r[0] for r in cursor.fetchall()]


def _in_tables(secret: str, tables: list[str]) -> list[str]:
    hits = []
    with connection.cursor() as cursor:
        for table in tables:
            cursor.execute(f'SELECT 1 FROM "{table}" t WHERE strpos(t::text, %s) > 0 LIMIT 1', [secret])
            if cursor.fetchone():
                hits.append(table)
    return hits


def _logs() -> list[Path]:
    from tests.support import processes

    # The product's processes only: the simulator stands in for Evolution, an outside system.
    return sorted(p for p in Path(processes.LOG_DIR).glob("*.log") if "simulator" not in p.name)


def run(ctx: Context) -> dict[str, Any]:
    from messaging.models import ApiKey, Instance

    secrets = sorted(set(ctx.world.raw_secrets + [settings.INTERNAL_WEBHOOK_SECRET, settings.SECRET_KEY,
                                                     settings.EVOLUTION_API_KEY]))
    tables = _tables()
    table_hits = {f"{s[:10]}…": _in_tables(s, tables) for s in secrets}
    table_hits = {k: v for k, v in table_hits.items() if v}
    logs = _logs()
    log_hits: dict[str, list[str]] = {}
    for path in logs:
        text = path.read_text(errors="replace")
        for s in secrets:
            if s in text:
                log_hits.setdefault(path.name, []).append(f"{s[:10]}…")
    hashes_ok = all(re.fullmatch(r"[0-9a-f]{64}", h) for h in ApiKey.objects.values_list("key_hash", flat=True))
    token_hashes_ok = all(not t or re.fullmatch(r"[0-9a-f]{64}", t)
                          for t in Instance.objects.values_list("evolution_token_hash", flat=True))
    figures = {"secrets_checked": len(secrets), "tables_searched": len(tables), "logs_searched": len(logs),
               "log_bytes_searched": sum(p.stat().st_size for p in logs),
               "tables_holding_a_secret": table_hits, "logs_holding_a_secret": log_hits,
               "api_keys_only_sha256": hashes_ok, "instance_tokens_only_sha256": token_hashes_ok}
    passed = not table_hits and not log_hits and hashes_ok and token_hashes_ok and bool(logs)
    return {"passed": passed, "fault": FAULT, "must": MUST, "figures": figures, "notes": []}
