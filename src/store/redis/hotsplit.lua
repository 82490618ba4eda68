#!lua name=hotsplit
--[[
hotsplit's Redis Functions library: the versioned compare-and-set of one copy, and the per-key
version counter. Loaded with FUNCTION LOAD REPLACE on every primary by src/store/redis/cas.rs,
which includes this file verbatim. Function names are global across libraries, so every function
here is prefixed with `hotsplit_`.

Versions travel as canonical decimal strings (digits only, no leading zero, 1..=2^64-1) and are
compared as strings: length first, then byte by byte. They are never converted with tonumber:
Lua numbers are doubles, which cannot tell 2^53 + 1 from 2^53. The byte-wise comparison also
avoids Lua's `<` on strings, which goes through strcoll and so depends on the server's locale.

Every argument is validated before the first write: a script that fails half-way keeps the
writes it already made, so an error must come before any of them.
]]

local MAX_VERSION = '18446744073709551615'

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
hotsplit_cas: KEYS[1] = copy key; ARGV = version, payload, tomb ("0" | "1"), expire_at_ms.

The copy is a hash with fields ver, val, tomb and exp. Returns
  {"applied", new}    after writing all four fields and PEXPIREAT expire_at_ms, when the copy
                      is missing or older;
  {"current", stored} when the copy already holds this version, of the same kind;
  {"stale", stored}   when it holds a newer version (nothing changes).
At an equal version a tombstone replaces a value, and a value never replaces a tombstone
(stale), so a publish and an invalidation of the same version end as the tombstone whatever
order they arrive in. The expiry is absolute and fixed at publish time, so re-sending a write
never extends a copy's life. A tombstone stores an empty val. An expiry in the past makes Redis
delete the copy, exactly as an expired copy would be.
]]
local function hotsplit_cas(keys, args)
  if #keys ~= 1 then
    return fail('hotsplit_cas', 'expects exactly one key, got', #keys)
  end
  if #args ~= 4 then
    return fail('hotsplit_cas', 'expects 4 arguments (version, payload, tomb, expire_at_ms), got', #args)
  end
  local key, version, payload, tomb, expire_at_ms = keys[1], args[1], args[2], args[3], args[4]
  if not is_version(version) then
    return fail('hotsplit_cas', 'version is not canonical decimal in 1..=18446744073709551615:', version)
  end
  if tomb ~= '0' and tomb ~= '1' then
    return fail('hotsplit_cas', 'tomb must be "0" or "1", got', tomb)
  end
  if not is_millis(expire_at_ms) then
    return fail('hotsplit_cas', 'expire_at_ms is not a canonical decimal of at most 18 digits:', expire_at_ms)
  end

  local stored = redis.call('HMGET', key, 'ver', 'tomb')
  local stored_version, stored_tomb = stored[1], stored[2]
  if stored_version then
    if not is_version(stored_version) then
      return fail('hotsplit_cas', 'the stored ver of ' .. key .. ' is corrupt:', stored_version)
    end
    if stored_tomb ~= '0' and stored_tomb ~= '1' then
      return fail('hotsplit_cas', 'the stored tomb of ' .. key .. ' is corrupt:', stored_tomb)
    end
    local order = compare_decimal(stored_version, version)
    if order > 0 then
      return {'stale', stored_version}
    elseif order == 0 then
      if stored_tomb == tomb then
        return {'current', stored_version}
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
  redis.call('PEXPIREAT', key, expire_at_ms)
  return {'applied', version}
end

--[[
hotsplit_alloc: KEYS[1] = counter key; ARGV[1] = ttl_ms.

INCRs the counter, sets its time to live to ttl_ms and returns the new value as a string. The
value is read back with GET: INCR's integer reply becomes a Lua double inside a script and would
lose precision above 2^53.
]]
local function hotsplit_alloc(keys, args)
  if #keys ~= 1 then
    return fail('hotsplit_alloc', 'expects exactly one key, got', #keys)
  end
  if #args ~= 1 then
    return fail('hotsplit_alloc', 'expects 1 argument (ttl_ms), got', #args)
  end
  local key, ttl_ms = keys[1], args[1]
  if not is_millis(ttl_ms) then
    return fail('hotsplit_alloc', 'ttl_ms is not a canonical decimal of at most 18 digits:', ttl_ms)
  end
  redis.call('INCR', key)
  local value = redis.call('GET', key)
  redis.call('PEXPIRE', key, ttl_ms)
  return value
end

redis.register_function('hotsplit_cas', hotsplit_cas)
redis.register_function('hotsplit_alloc', hotsplit_alloc)
