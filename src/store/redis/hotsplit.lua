#!lua name=hotsplit_v2
--[[
hotsplit's Redis Functions library, version 2: the versioned compare-and-set of one copy, the
per-key version counter, the layout record's compare-and-set, the live sets and the lease of
fleet-wide jobs (the scrub). Loaded on every primary by src/store/redis/library.rs, which
includes this file verbatim (src/store/library.rs).
Function names are global across libraries, so every function is registered under a name with
the `hotsplit_` prefix and this version's `_v2` suffix: another release's library registers other
names, and both run side by side on one cluster. Any change to this file is a new version
(src/store/library.rs records its SHA-256).

Versions travel as canonical decimal strings (digits only, no leading zero, 1..=2^64-1) and are
compared as strings: length first, then byte by byte. They are never converted with tonumber:
Lua numbers are doubles, which cannot tell 2^53 + 1 from 2^53. The byte-wise comparison also
avoids Lua's `<` on strings, which goes through strcoll and so depends on the server's locale.

Every argument is validated before the first write: a script that fails half-way keeps the
writes it already made, so an error must come before any of them.
]]

local MAX_VERSION = '18446744073709551615'

-- The largest floor hotsplit_alloc accepts: INCR works on signed 64-bit integers, so the
-- counter can be set to at most 2^63 - 2 and still be incremented.
local MAX_COUNTER_FLOOR = '9223372036854775806'

-- The longest layout record hotsplit_layout accepts (`copies:max_copies`, two u32).
local MAX_LAYOUT_LEN = 21

-- Longest accepted millisecond argument (expiry or ttl). 18 digits stay below 2^63, so neither
-- PEXPIREAT nor PEXPIRE can overflow and fail after the hash was already written.
local MAX_MS_DIGITS = 18

-- Compares two digit strings without leading zeros: -1, 0 or 1.
local function compare_decimal(a, b)
  local la, lb = #a, #b
  if la ~= lb then
    return la < lb and -1 or 1
  end
  for i = 1, la do
    local ca, cb = string.byte(a, i), string.byte(b, i)
    if ca ~= cb then
      return ca < cb and -1 or 1
    end
  end
  return 0
end

-- True when `s` is digits only with no leading zero ("0" itself is allowed).
local function is_canonical_uint(s)
  if type(s) ~= 'string' or #s == 0 or not string.find(s, '^%d+$') then
    return false
  end
  return #s == 1 or string.byte(s, 1) ~= 48
end

-- True when `s` is a canonical version: 1..=18446744073709551615.
local function is_version(s)
  if not is_canonical_uint(s) or s == '0' or #s > #MAX_VERSION then
    return false
  end
  return compare_decimal(s, MAX_VERSION) <= 0
end

-- True when `s` is a canonical millisecond count of at most MAX_MS_DIGITS digits.
local function is_millis(s)
  return is_canonical_uint(s) and #s <= MAX_MS_DIGITS
end

local function fail(func, what, value)
  return redis.error_reply(string.format('ERR %s: %s %q', func, what, tostring(value)))
end

--[[
hotsplit_cas: KEYS[1] = copy key;
ARGV = version, payload, tomb ("0" | "1"), expire_at_ms, retain_until_ms, now_ms.

The copy is a hash with fields ver, val, tomb and exp. `exp` (expire_at_ms) is when the copy stops
being served: every read treats a copy whose exp is not after its own clock as missing. The key
itself lives until retain_until_ms (PEXPIREAT), later than exp, so the version stays known after
the value stopped being served and an older version is still refused: expiry makes a copy
disappear, never come back older. now_ms is the caller's clock, the one that computed exp, and
decides whether the stored copy is still served. Returns
  {"applied", new}     after writing all four fields, when the copy is missing or older, or holds
                       this version of the same kind but is no longer served (a refill; only when
                       the new exp is later than the stored one);
  {"current", stored}  when the copy already holds this version, of the same kind and body;
  {"conflict", stored} when the copy holds this version with a different body (a version issued
                       twice: nothing changes);
  {"stale", stored}    when it holds a newer version (nothing changes).
At an equal version a tombstone replaces a value, and a value never replaces a tombstone
(stale), so a publish and an invalidation of the same version end as the tombstone whatever
order they arrive in. The expiries are absolute and fixed at publish time, so re-sending a write
never extends a copy's life. The key's expiry only ever moves later (PEXPIREAT GT on an existing
key), so a write can never make the store forget a newer version sooner. A tombstone stores an
empty val. A retain_until_ms in the past makes Redis delete the copy, exactly as an expired copy
would be.
]]
local function hotsplit_cas(keys, args)
  if #keys ~= 1 then
    return fail('hotsplit_cas', 'expects exactly one key, got', #keys)
  end
  if #args ~= 6 then
    return fail('hotsplit_cas', 'expects 6 arguments (version, payload, tomb, expire_at_ms, retain_until_ms, now_ms), got', #args)
  end
  local key, version, payload, tomb = keys[1], args[1], args[2], args[3]
  local expire_at_ms, retain_until_ms, now_ms = args[4], args[5], args[6]
  if not is_version(version) then
    return fail('hotsplit_cas', 'version is not canonical decimal in 1..=18446744073709551615:', version)
  end
  if tomb ~= '0' and tomb ~= '1' then
    return fail('hotsplit_cas', 'tomb must be "0" or "1", got', tomb)
  end
  if not is_millis(expire_at_ms) then
    return fail('hotsplit_cas', 'expire_at_ms is not a canonical decimal of at most 18 digits:', expire_at_ms)
  end
  if not is_millis(retain_until_ms) then
    return fail('hotsplit_cas', 'retain_until_ms is not a canonical decimal of at most 18 digits:', retain_until_ms)
  end
  if not is_millis(now_ms) then
    return fail('hotsplit_cas', 'now_ms is not a canonical decimal of at most 18 digits:', now_ms)
  end

  local stored = redis.call('HMGET', key, 'ver', 'tomb', 'exp')
  local stored_version, stored_tomb, stored_exp = stored[1], stored[2], stored[3]
  if stored_version then
    if not is_version(stored_version) then
      return fail('hotsplit_cas', 'the stored ver of ' .. key .. ' is corrupt:', stored_version)
    end
    if stored_tomb ~= '0' and stored_tomb ~= '1' then
      return fail('hotsplit_cas', 'the stored tomb of ' .. key .. ' is corrupt:', stored_tomb)
    end
    if not is_millis(stored_exp) then
      return fail('hotsplit_cas', 'the stored exp of ' .. key .. ' is corrupt:', stored_exp)
    end
    local order = compare_decimal(stored_version, version)
    if order > 0 then
      return {'stale', stored_version}
    elseif order == 0 then
      if stored_tomb == tomb then
        if tomb == '0' and redis.call('HGET', key, 'val') ~= payload then
          return {'conflict', stored_version}
        end
        -- The same edit again: current while the copy is served; a refill once it is not,
        -- when this write would serve it longer.
        if compare_decimal(stored_exp, now_ms) > 0 or compare_decimal(expire_at_ms, stored_exp) <= 0 then
          return {'current', stored_version}
        end
      elseif stored_tomb == '1' then
        -- A value never replaces the tombstone of its own version.
        return {'stale', stored_version}
      end
      -- A tombstone replaces the value of its own version: fall through and write it.
    end
  end

  if tomb == '1' then
    payload = ''
  end
  redis.call('HSET', key, 'ver', version, 'val', payload, 'tomb', tomb, 'exp', expire_at_ms)
  if stored_version then
    redis.call('PEXPIREAT', key, retain_until_ms, 'GT')
  else
    redis.call('PEXPIREAT', key, retain_until_ms)
  end
  return {'applied', version}
end

--[[
hotsplit_alloc: KEYS[1] = counter key; ARGV = ttl_ms, floor.

Sets the counter to max(counter, floor) + 1 and returns the new value as a string. floor is "0",
or the highest version the copies reported after a publish was refused (stale, or a conflict of
a version issued twice): a counter that lost increments in a failover, or expired before the
copies it versioned, then continues above every version in use. The counter's time to live only
ever grows (to at least ttl_ms), so an instance with a shorter family TTL cannot shorten it. The
value is read back with GET: INCR's integer reply becomes a Lua double inside a script and would
lose precision above 2^53.
]]
local function hotsplit_alloc(keys, args)
  if #keys ~= 1 then
    return fail('hotsplit_alloc', 'expects exactly one key, got', #keys)
  end
  if #args ~= 2 then
    return fail('hotsplit_alloc', 'expects 2 arguments (ttl_ms, floor), got', #args)
  end
  local key, ttl_ms, floor = keys[1], args[1], args[2]
  if not is_millis(ttl_ms) then
    return fail('hotsplit_alloc', 'ttl_ms is not a canonical decimal of at most 18 digits:', ttl_ms)
  end
  if not is_canonical_uint(floor) or compare_decimal(floor, MAX_COUNTER_FLOOR) > 0 then
    return fail('hotsplit_alloc', 'floor is not a canonical decimal in 0..=9223372036854775806:', floor)
  end
  local current = redis.call('GET', key)
  if current and not is_canonical_uint(current) then
    return fail('hotsplit_alloc', 'the counter ' .. key .. ' is corrupt:', current)
  end
  if compare_decimal(floor, current or '0') > 0 then
    redis.call('SET', key, floor, 'KEEPTTL')
  end
  redis.call('INCR', key)
  local value = redis.call('GET', key)
  local pttl = redis.call('PTTL', key)
  -- Milliseconds of a time to live fit a double exactly well below 2^53 (285,000 years).
  if pttl < 0 or pttl < tonumber(ttl_ms) then
    redis.call('PEXPIRE', key, ttl_ms)
  end
  return value
end

--[[
hotsplit_layout: KEYS[1] = layout record key; ARGV = expected, new.

A compare-and-set of a family's layout record (`copies:max_copies`): writes new only when the
record holds expected ("" for no record), so a concurrent change is never overwritten blindly.
Returns {"applied", new}, or {"changed", current} (current is "" when there is no record) and
changes nothing.
]]
local function hotsplit_layout(keys, args)
  if #keys ~= 1 then
    return fail('hotsplit_layout', 'expects exactly one key, got', #keys)
  end
  if #args ~= 2 then
    return fail('hotsplit_layout', 'expects 2 arguments (expected, new), got', #args)
  end
  local key, expected, new = keys[1], args[1], args[2]
  if #expected > MAX_LAYOUT_LEN or (#expected > 0 and not string.find(expected, '^%d+:%d+$')) then
    return fail('hotsplit_layout', 'expected is neither "" nor copies:max_copies:', expected)
  end
  if #new > MAX_LAYOUT_LEN or not string.find(new, '^%d+:%d+$') then
    return fail('hotsplit_layout', 'new is not copies:max_copies:', new)
  end
  local current = redis.call('GET', key) or ''
  if current ~= expected then
    return {'changed', current}
  end
  redis.call('SET', key, new)
  return {'applied', new}
end

--[[
hotsplit_live: KEYS[1] = a family's live set (#hotsplit#live#<family>, a sorted set);
ARGV = member, ttl_ms.

Each running instance keeps one member `<copies>:<instance>` in its families' live sets, scored
by the Unix millisecond (the server's clock, TIME) at which it lapses. The call first drops the
lapsed members, then adds or refreshes member to lapse ttl_ms from now (a ttl_ms of "0" removes
it: the instance stops), sets the key to expire with its last member, and returns the other
live members. Writers write every copy below the largest live copy count, so an instance with
more copies than another never reads a copy that misses the other's edits (ARCHITECTURE.md,
"A resize across instances").
]]
local function hotsplit_live(keys, args)
  if #keys ~= 1 then
    return fail('hotsplit_live', 'expects exactly one key, got', #keys)
  end
  if #args ~= 2 then
    return fail('hotsplit_live', 'expects 2 arguments (member, ttl_ms), got', #args)
  end
  local key, member, ttl_ms = keys[1], args[1], args[2]
  if #member > 75 or not string.find(member, '^%d+:[%w%-_%.]+$') then
    return fail('hotsplit_live', 'member is not copies:instance:', member)
  end
  if not is_millis(ttl_ms) or #ttl_ms > 12 then
    return fail('hotsplit_live', 'ttl_ms is not a canonical decimal of at most 12 digits:', ttl_ms)
  end
  local time = redis.call('TIME')
  -- Unix milliseconds (about 1.7e12) and a ttl below 1e12 stay exact in a double.
  local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%.0f', now))
  if ttl_ms == '0' then
    redis.call('ZREM', key, member)
  else
    redis.call('ZADD', key, string.format('%.0f', now + tonumber(ttl_ms)), member)
  end
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if last[2] then
    redis.call('PEXPIREAT', key, last[2])
  end
  local others = {}
  for _, live in ipairs(redis.call('ZRANGE', key, 0, -1)) do
    if live ~= member then
      others[#others + 1] = live
    end
  end
  return others
end

--[[
hotsplit_lease: KEYS[1] = a lease key (#hotsplit#lease#<name>, a string); ARGV = holder, ttl_ms.

A lease that one instance at a time holds, so a fleet-wide job (the scrub) runs once, not once
per instance. When the key is absent or holds holder, sets it to holder for ttl_ms (taken or
renewed) and returns {"held", holder}; a ttl_ms of "0" deletes it instead (released, also
{"held", holder}). When another holder has it, changes nothing and returns {"taken", other}.
A holder that stalls past its ttl loses the lease to the next caller; its next renewal then
answers "taken", so it never takes a lease back from a live holder.
]]
local function hotsplit_lease(keys, args)
  if #keys ~= 1 then
    return fail('hotsplit_lease', 'expects exactly one key, got', #keys)
  end
  if #args ~= 2 then
    return fail('hotsplit_lease', 'expects 2 arguments (holder, ttl_ms), got', #args)
  end
  local key, holder, ttl_ms = keys[1], args[1], args[2]
  if #holder > 64 or not string.find(holder, '^[%w%-_%.]+$') then
    return fail('hotsplit_lease', 'holder is not 1..=64 letters, digits, -, _ or .:', holder)
  end
  if not is_millis(ttl_ms) or #ttl_ms > 12 then
    return fail('hotsplit_lease', 'ttl_ms is not a canonical decimal of at most 12 digits:', ttl_ms)
  end
  local current = redis.call('GET', key)
  if current and current ~= holder then
    return {'taken', current}
  end
  if ttl_ms == '0' then
    if current then
      redis.call('DEL', key)
    end
  else
    redis.call('SET', key, holder, 'PX', ttl_ms)
  end
  return {'held', holder}
end

redis.register_function('hotsplit_cas_v2', hotsplit_cas)
redis.register_function('hotsplit_layout_v2', hotsplit_layout)
redis.register_function('hotsplit_alloc_v2', hotsplit_alloc)
redis.register_function('hotsplit_live_v2', hotsplit_live)
redis.register_function('hotsplit_lease_v2', hotsplit_lease)
