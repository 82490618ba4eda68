-- The wrk script of the HTTP read benchmarks (scripts/bench-side-by-side.sh and
-- scripts/bench-near.sh): wrk -s scripts/wrk-affine.lua BASE -- PATH COUNT [PAUSE_MS].
-- Each wrk thread cycles through COUNT client ids (about 20 bytes each), one per request, each
-- request being PATH followed by the id, so the reads spread over every copy as many real clients
-- would. wrk's request() hook cannot tell connections apart, so ids rotate per request rather
-- than being pinned to a connection; the work per request (hash the id, pick the copy, one read)
-- is the same either way.
-- With PAUSE_MS, each connection pauses that long after every answer (wrk's delay() hook), so
-- the request rate is set by the connection count: at most 1000 / PAUSE_MS per connection.
-- Without it no delay() is defined at all, since wrk then schedules every request through a
-- timer, which would cost the throughput runs.
local threads = 0

function setup(thread)
    thread:set("thread_id", threads)
    threads = threads + 1
end

function init(args)
    local path, count = args[1], tonumber(args[2])
    requests = {}
    for k = 1, count do
        local client = string.format("client-%02d-%011d", thread_id, k)
        requests[k] = wrk.format("GET", path .. client)
    end
    next_request = 0
    local pause = tonumber(args[3])
    if pause then
        -- wrk looks for delay() after init() has run, in each thread's own Lua state.
        function delay()
            return pause
        end
    end
end

function request()
    next_request = next_request % #requests + 1
    return requests[next_request]
end
