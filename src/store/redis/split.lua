-- The compare-and-set of one split record: KEYS[1] is the family's hash, ARGV[1] the key,
-- ARGV[2] the expected text ('' for none), ARGV[3] the new text ('' to remove). Returns 1 when
-- it applied, 0 when the field held something else (kept).
local current = redis.call('HGET', KEYS[1], ARGV[1])
if (current == false and ARGV[2] == '') or current == ARGV[2] then
  if ARGV[3] == '' then
    redis.call('HDEL', KEYS[1], ARGV[1])
  else
    redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
  end
  return 1
end
return 0
