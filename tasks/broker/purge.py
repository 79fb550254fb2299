"""Removing a cancelled job's queued INIT messages from the broker (issue 25).

After a cancel's commit no first attempt of the job can be claimed: the cancel ended every
rollout still queued for INIT (`tasks.writes.cancels`). Their messages would still be delivered one
by one, ahead of every later job's, only to be dropped by the INIT workers
(`cancels.CancelMemory.known_cancelled`). This removes them where they wait, so the next job starts now.

What is removed is exactly what an INIT worker would drop without a database write: an INIT
message (`raas.init`) of attempt 1 that names the job in its `raas_job` header
(`tasks.broker.publish`). Never a RUN or EVAL message (its rollout holds a sandbox that only its
claim releases), never a later attempt (a retry published after the cancel must be claimed
to end as cancelled), never a re-evaluation. A message a worker already took is not in the
list any more and is handled as before.

kombu keeps a queue as one Redis list per priority step (`init`, `init\\x06\\x161`, ...):
published with LPUSH on the left, taken with BRPOP from the right. A Lua script examines one
chunk per call from the right end up (the messages served next come first), replaces the
job's messages by a tombstone and removes the tombstones, all in one atomic call, so Redis
is never busy for long and a worker never sees a tombstone. The chunk's top kept message
marks how far the scan got: every message is unique (its task id), the next call finds it
again with LPOS, so workers taking from the right and publishers pushing on the left meanwhile
neither make the scan skip messages nor repeat them (a mark a worker took means everything
below it was taken: the scan starts again at the right end).

A purge that fails (Redis away, not the Redis transport) loses nothing: the workers' drop
path still ends every stale message. The caller logs it and goes on.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

import redis

from tasks.broker.config import INIT_QUEUE, TASK_NAMES

log = logging.getLogger(__name__)

CHUNK = 500  # messages examined per script call (~0.5 MB of JSON: a few ms of Redis time)
BUDGET_SECONDS = 30.0  # a purge that chases publishers longer than this stops (workers drop the rest)

# KEYS[1]: one priority list. ARGV: job id, chunk size, mark ('' = start at the right end),
# tombstone, task name. Returns {removed, new mark, 1 when the scan reached the left end}.
# At the right end (the usual case: a cancelled backlog is served next) the chunk is popped
# and its kept messages pushed back; further in, LSET + LREM. Both stay O(chunk + distance
# from the right end): Redis finds an index by walking the list from the nearer end.
_SCRIPT = """
local key, job, chunk, mark, tomb, task = KEYS[1], ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4], ARGV[5]
local len = redis.call('LLEN', key)
local below = 0
if mark ~= '' then
  local pos = redis.call('LPOS', key, mark, 'RANK', -1)
  if pos then below = len - pos end
end
if below >= len then return {0, mark, 1} end
local items = redis.call('LRANGE', key, -(below + chunk), -(below + 1))
local n = #items
local stale, kept, top = {}, {}, nil
for i = 1, n do
  local item = items[i]
  local hit = false
  if string.find(item, job, 1, true) then
    local ok, msg = pcall(cjson.decode, item)
    local h = ok and type(msg) == 'table' and msg['headers']
    hit = type(h) == 'table' and h['task'] == task and h['raas_job'] == job and tonumber(h['raas_attempt']) == 1
  end
  if hit then stale[#stale + 1] = i else kept[#kept + 1] = item end
end
local removed = #stale
top = kept[1]
if removed > 0 and below == 0 then
  -- the window is the right end: take it off and put the kept ones back in their order
  redis.call('RPOP', key, n)
  for i = 1, #kept, 100 do redis.call('RPUSH', key, unpack(kept, i, math.min(i + 99, #kept))) end
elseif removed > 0 then
  -- inside the list: mark from the right (Redis walks from the nearer end), then remove
  for _, i in ipairs(stale) do redis.call('LSET', key, i - n - below - 1, tomb) end
  redis.call('LREM', key, -removed, tomb)
end
local done = 0
if below + n >= len then done = 1 end
return {removed, top or mark, done}
"""


def purge_job(celery: Any, job_id: str, chunk: int = CHUNK, budget: float = BUDGET_SECONDS) -> int | None:
    """Remove the job's stale INIT messages from every priority list of the INIT queue.

    Returns how many were removed; None when the broker is not Redis (nothing to do).
    Raises the broker's error when Redis cannot be reached (the caller logs it).
    """
    with celery.connection_for_write() as conn:
        channel = conn.default_channel
        if not hasattr(channel, "_q_for_pri"):
            return None
        client = redis.Redis(connection_pool=channel.pool)
        script = client.register_script(_SCRIPT)
        prefix = getattr(channel, "global_keyprefix", "") or ""
        keys = dict.fromkeys(prefix + channel._q_for_pri(INIT_QUEUE, p) for p in channel.priority_steps)
        started = time.monotonic()
        removed = sum(_purge_list(script, key, job_id, chunk, started + budget) for key in keys)
    log.log(
        logging.INFO if removed else logging.DEBUG,  # a worker's repeat purge often finds none
        "job %s: removed %s queued INIT messages from the broker in %.3fs",
        job_id,
        removed,
        time.monotonic() - started,
    )
    return removed


def _purge_list(script: Any, key: str, job_id: str, chunk: int, deadline: float) -> int:
    """One priority list, chunk by chunk from the right end until the scan reaches the left."""
    tomb = f"raas-purge-tombstone:{uuid.uuid4().hex}"  # never a real message (not JSON)
    mark: bytes | str = ""
    removed = 0
    while True:
        n, mark, done = script(keys=[key], args=[job_id, chunk, mark, tomb, TASK_NAMES["init"]])
        removed += int(n)
        if int(done) or time.monotonic() > deadline:
            return removed


def purge_quietly(celery: Any, job_id: str) -> int | None:
    """`purge_job`, with any failure logged instead of raised: the cancel already committed
    and the workers' drop path ends whatever stays in the queue."""
    try:
        return purge_job(celery, job_id)
    except Exception as exc:  # noqa: BLE001 - Redis away, a transport without lists, ...
        log.warning("job %s: the queued INIT messages stay in the broker (%s); workers drop them", job_id, exc)
        return None
