"""The Lua scripts of the Redis tier: the steps that must compare and act in one step.

Redis runs a script atomically, so "delete only if it is still the value I saw" cannot
race with another client's write. Every script touches keys of one cache key only (one
hash tag, fcache.cache.redis.layout), so it runs unchanged on a Redis Cluster. Scripts
are sent by digest (EVALSHA), and loaded again by redis-py when a restarted Redis has
forgotten them.
"""

from __future__ import annotations

# KEYS[1] the entry; ARGV[1] the new value; ARGV[2] a time to live in ms, 0 for none.
# Replaces the entry and returns the old one's frame (its first 48 bytes) or false, so the
# writer can delete the chunks the old generation leaves behind without reading them.
SWAP = """
local old = redis.call('GET', KEYS[1])
if tonumber(ARGV[2]) > 0 then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
else
  redis.call('SET', KEYS[1], ARGV[1])
end
if old then return string.sub(old, 1, 48) end
return false
"""

# KEYS[1] the entry, KEYS[2..] its chunks; ARGV[1] the frame the caller read. Deletes them
# all only if the entry still begins with that frame: a newer put is never removed by a
# reader that found the older one corrupt or evicted.
DELETE_IF_SAME = """
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, string.len(ARGV[1])) == ARGV[1] then
  redis.call('DEL', unpack(KEYS))
  return 1
end
return 0
"""

# KEYS[1] a lease; ARGV[1] the holder's token. Only the holder releases its lease: a
# holder whose lease lapsed and passed to another process deletes nothing.
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

# KEYS[1] a lease; ARGV[1] the holder's token; ARGV[2] the new time to live in ms. 1 if
# renewed, 0 if the lease is no longer this holder's.
RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
