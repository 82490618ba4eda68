// The hotsplit status page. It polls GET /v1/fleet (every instance's figures, gathered by the
// instance that serves this page), keeps a rolling window of samples in memory for the figures
// over time, and renders every datum with textContent: nothing from the server is ever parsed
// as HTML. Served from the binary under a Content-Security-Policy that allows this file and
// its stylesheet only.
"use strict";

(function () {
  const WINDOW_MS = 10 * 60 * 1000;
  const MIN_POLL_MS = 1000;
  const SVG = "http://www.w3.org/2000/svg";

  // Samples per instance id, oldest first: { t, depth, oldestAgeMs, lagP99: {replica: ms},
  // routing: {class: {reads, primary, byReason}}, near: {hits, total} }.
  const history = new Map();
  let pollMs = 2000;
  let failures = 0;

  // An element with text content and data attributes; `text` is always set as text.
  function el(tag, text, attrs) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) {
      node.textContent = String(text);
    }
    if (attrs) {
      for (const [name, value] of Object.entries(attrs)) {
        if (name === "class") {
          node.className = value;
        } else {
          node.setAttribute("data-" + name, String(value));
        }
      }
    }
    return node;
  }

  function num(value, digits) {
    if (value === null || value === undefined || Number.isNaN(value)) {
      return "–";
    }
    return digits === undefined ? String(value) : Number(value).toFixed(digits);
  }

  function pct(fraction) {
    return fraction === null || fraction === undefined ? "–" : (fraction * 100).toFixed(1) + "%";
  }

  function seconds(ms) {
    return ms === null || ms === undefined ? "–" : (ms / 1000).toFixed(1) + " s";
  }

  // A cell of instance `id` holding one figure, named by `field` for tests and tools.
  function cell(text, id, field, extra) {
    const attrs = Object.assign({ instance: id, field: field }, extra || {});
    const td = el("td", text, attrs);
    if (typeof text === "number" || /^[0-9.–%s ]+$/.test(String(text))) {
      td.className = "num";
    }
    return td;
  }

  // A sparkline of `values` (numbers or null), with an optional dashed `limit` line.
  function spark(values, limit) {
    const svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("class", "spark");
    svg.setAttribute("viewBox", "0 0 120 24");
    svg.setAttribute("preserveAspectRatio", "none");
    const known = values.filter((v) => v !== null && v !== undefined);
    let top = Math.max(1, ...known, limit || 0);
    const points = [];
    values.forEach((v, i) => {
      if (v === null || v === undefined) {
        return;
      }
      const x = values.length < 2 ? 120 : (i * 120) / (values.length - 1);
      const y = 23 - (v / top) * 22;
      points.push(x.toFixed(1) + "," + y.toFixed(1));
    });
    const line = document.createElementNS(SVG, "polyline");
    line.setAttribute("points", points.join(" "));
    svg.appendChild(line);
    if (limit) {
      const y = (23 - (limit / top) * 22).toFixed(1);
      const budget = document.createElementNS(SVG, "line");
      budget.setAttribute("x1", "0");
      budget.setAttribute("x2", "120");
      budget.setAttribute("y1", y);
      budget.setAttribute("y2", y);
      svg.appendChild(budget);
    }
    return svg;
  }

  function replaceRows(tableId, rows) {
    const body = document.querySelector("#" + tableId + " tbody");
    body.replaceChildren(...rows);
  }

  function row(cells) {
    const tr = document.createElement("tr");
    tr.append(...cells);
    return tr;
  }

  function record(id, status, now) {
    const samples = history.get(id) || [];
    const lagP99 = {};
    for (const line of status.lag || []) {
      lagP99[line.replica] = line.lag_ms ? line.lag_ms.p99 : null;
    }
    const routing = {};
    for (const line of status.routing || []) {
      routing[line.class] = { reads: line.reads, primary: line.primary, byReason: line.primary_by_reason || {} };
    }
    const near = status.near_cache || {};
    samples.push({
      t: now,
      depth: status.retry_queue ? status.retry_queue.depth : null,
      oldestAgeMs: status.retry_queue ? status.retry_queue.oldest_age_ms : null,
      lagP99: lagP99,
      routing: routing,
      near: { hits: near.hits || 0, total: (near.hits || 0) + (near.misses || 0) + (near.coalesced || 0) + (near.floor_reads || 0) },
    });
    while (samples.length > 0 && samples[0].t < now - WINDOW_MS) {
      samples.shift();
    }
    history.set(id, samples);
    return samples;
  }

  function renderInstances(view, now) {
    replaceRows("instances", view.instances.map((member) => {
      const info = member.instance;
      const id = info.id;
      const name = el("td", id === view.this ? id + " (this page)" : id, { instance: id, field: "id", class: "key" });
      const figuresAge = member.status ? Math.max(0, view.at_ms - member.status.at_ms) : null;
      return row([
        name,
        cell(info.listen, id, "listen"),
        cell(info.admin || "–", id, "admin"),
        cell(info.release, id, "release"),
        cell(info.library || "–", id, "library"),
        cell(new Date(info.started_ms).toISOString(), id, "started"),
        cell(seconds(Math.max(0, view.at_ms - info.heartbeat_ms)), id, "heartbeat-age"),
        cell(member.status ? seconds(figuresAge) : "no figures published", id, "figures-age"),
      ]);
    }));
  }

  function renderQueue(members) {
    const rows = [];
    const entries = [];
    for (const { id, status, samples } of members) {
      const queue = status.retry_queue;
      const depths = samples.map((s) => s.depth);
      const nodes = el("td", null, { instance: id, field: "queue-nodes" });
      const list = el("ul", null, { class: "plain" });
      for (const node of queue.nodes) {
        list.append(el("li", node.node + ": " + node.entries + " " + node.state));
      }
      nodes.append(list);
      const sparkCell = el("td", null, { instance: id, field: "queue-spark" });
      sparkCell.append(spark(depths));
      rows.push(row([
        el("td", id, { instance: id, field: "id", class: "key" }),
        cell(num(queue.depth), id, "queue-depth"),
        cell(seconds(queue.oldest_age_ms), id, "queue-oldest-age"),
        cell(num(queue.bytes), id, "queue-bytes"),
        cell(num(Math.max(0, ...depths.filter((d) => d !== null))), id, "queue-depth-max"),
        sparkCell,
        nodes,
      ]));
      for (const entry of queue.entries) {
        const tr = row([
          el("td", id, { instance: id, field: "id", class: "key" }),
          el("td", entry.copy_key, { instance: id, field: "entry-key", class: "key" }),
          cell(num(entry.version), id, "entry-version"),
          cell(num(entry.attempts), id, "entry-attempts"),
          el("td", entry.last_error || "–", { instance: id, field: "entry-error" }),
        ]);
        entries.push(tr);
      }
    }
    replaceRows("queue", rows);
    replaceRows("queue-entries", entries);
  }

  function renderLag(members) {
    const rows = [];
    for (const { id, status, samples } of members) {
      const budgets = {};
      for (const cls of status.classes || []) {
        if (cls.staleness_budget_ms !== undefined && cls.staleness_budget_ms !== null) {
          budgets[cls.class] = cls.staleness_budget_ms;
        }
      }
      for (const line of status.lag) {
        const figures = line.lag_ms || {};
        const judged = el("td", null, { instance: id, field: "lag-budgets", replica: line.replica });
        const list = el("ul", null, { class: "plain" });
        for (const [cls, budget] of Object.entries(budgets)) {
          const withinNow = line.within_budget ? line.within_budget[cls] : undefined;
          const p99Within = figures.p99 !== null && figures.p99 !== undefined && figures.p99 <= budget;
          const text = cls + " (" + budget + " ms): now " + (withinNow ? "within" : "over") + ", p99 " + (p99Within ? "within" : "over");
          list.append(el("li", text, { class: withinNow && p99Within ? "good" : "bad" }));
        }
        judged.append(list);
        const sparkCell = el("td", null, { instance: id, field: "lag-spark", replica: line.replica });
        const tightest = Math.min(...Object.values(budgets));
        sparkCell.append(spark(samples.map((s) => (s.lagP99[line.replica] === undefined ? null : s.lagP99[line.replica])), Number.isFinite(tightest) ? tightest : 0));
        rows.push(row([
          el("td", id, { instance: id, field: "id", class: "key" }),
          el("td", line.replica, { instance: id, field: "lag-replica", replica: line.replica }),
          el("td", line.primary, { instance: id, field: "lag-primary", replica: line.replica }),
          cell(num(figures.now, 1), id, "lag-now", { replica: line.replica }),
          cell(num(figures.p50, 1), id, "lag-p50", { replica: line.replica }),
          cell(num(figures.p99, 1), id, "lag-p99", { replica: line.replica }),
          sparkCell,
          judged,
        ]));
      }
    }
    replaceRows("lag", rows);
  }

  // The share of reads the primaries served between the oldest sample in the window and now.
  function windowShare(samples, cls) {
    const first = samples.find((s) => s.routing[cls] !== undefined);
    const last = samples[samples.length - 1];
    if (!first || !last || !last.routing[cls]) {
      return null;
    }
    const reads = last.routing[cls].reads - first.routing[cls].reads;
    const primary = last.routing[cls].primary - first.routing[cls].primary;
    return reads > 0 ? primary / reads : null;
  }

  function renderRouting(members) {
    const rows = [];
    for (const { id, status, samples } of members) {
      for (const line of status.routing) {
        const reasons = el("td", null, { instance: id, field: "routing-reasons", class_name: line.class });
        const list = el("ul", null, { class: "plain" });
        for (const [reason, count] of Object.entries(line.primary_by_reason || {})) {
          if (count > 0) {
            list.append(el("li", reason + ": " + count, { instance: id, field: "routing-reason", class_name: line.class, reason: reason }));
          }
        }
        reasons.append(list);
        rows.push(row([
          el("td", id, { instance: id, field: "id", class: "key" }),
          el("td", line.class, { instance: id, field: "routing-class", class_name: line.class }),
          cell(num(line.reads), id, "routing-reads", { class_name: line.class }),
          cell(num(line.primary), id, "routing-primary", { class_name: line.class }),
          cell(pct(line.primary_fraction), id, "routing-share", { class_name: line.class }),
          cell(pct(windowShare(samples, line.class)), id, "routing-share-window", { class_name: line.class }),
          reasons,
        ]));
      }
    }
    replaceRows("routing", rows);
  }

  // Whatever scrub figures an instance reports (GET /v1/scrub's view, when it has one), as
  // name and value lines; the section shows only when some instance reports them.
  function renderScrub(members) {
    const rows = [];
    for (const { id, status } of members) {
      if (!status.scrub || typeof status.scrub !== "object") {
        continue;
      }
      // One level of nesting (the running and the last pass) becomes `pass.figure` lines; a
      // list (the paused families) is shown joined.
      const lines = [];
      for (const [name, value] of Object.entries(status.scrub)) {
        if (Array.isArray(value)) {
          lines.push([name, value.join(", ")]);
        } else if (value !== null && typeof value === "object") {
          for (const [inner, figure] of Object.entries(value)) {
            if (figure === null || typeof figure !== "object") {
              lines.push([name + "." + inner, figure]);
            }
          }
        } else {
          lines.push([name, value]);
        }
      }
      for (const [name, value] of lines) {
        rows.push(row([
          el("td", id, { instance: id, field: "id", class: "key" }),
          el("td", name, { instance: id, field: "scrub-name", name: name }),
          cell(String(value), id, "scrub-value", { name: name }),
        ]));
      }
    }
    document.getElementById("scrub-section").hidden = rows.length === 0;
    replaceRows("scrub", rows);
  }

  function renderNear(members) {
    const rows = [];
    for (const { id, status, samples } of members) {
      const near = status.near_cache;
      const first = samples[0];
      const last = samples[samples.length - 1];
      const total = last.near.total - first.near.total;
      const ratio = total > 0 ? (last.near.hits - first.near.hits) / total : null;
      const hottest = el("td", null, { instance: id, field: "near-hottest" });
      const list = el("ul", null, { class: "plain" });
      for (const copy of near.hottest || []) {
        list.append(el("li", copy.copy_key + " (" + copy.hits + " hits)", { instance: id, field: "near-hot-copy", class: "key" }));
      }
      hottest.append(list);
      rows.push(row([
        el("td", id, { instance: id, field: "id", class: "key" }),
        cell(near.enabled ? "yes" : "no", id, "near-enabled"),
        cell(near.enabled ? pct(near.hit_ratio) : "–", id, "near-hit-ratio"),
        cell(near.enabled ? pct(ratio) : "–", id, "near-hit-ratio-window"),
        cell(num(near.hits), id, "near-hits"),
        cell(num(near.misses), id, "near-misses"),
        cell(num(near.entries), id, "near-entries"),
        cell(num(near.bytes), id, "near-bytes"),
        hottest,
      ]));
    }
    replaceRows("near", rows);
  }

  function renderHot(members) {
    const rows = [];
    for (const { id, status } of members) {
      const hot = status.hot_keys;
      if (!hot) continue;
      for (const key of hot.keys || []) {
        rows.push(row([
          el("td", id, { instance: id, field: "id", class: "key" }),
          el("td", key.key, { instance: id, field: "hot-key", class: "key" }),
          cell(num(Math.round(key.rate)), id, "hot-rate"),
          cell(num(Math.round(key.store_rate)), id, "hot-store-rate"),
          cell(pct(key.share), id, "hot-share"),
          cell(key.hot ? "yes" : "no", id, "hot-hot"),
          cell(key.family, id, "hot-family"),
          cell(num(key.copies), id, "hot-copies"),
          cell(key.policy, id, "hot-policy"),
        ]));
      }
    }
    replaceRows("hot", rows);
  }

  function renderFamilies(members) {
    const rows = [];
    for (const { id, status } of members) {
      for (const family of status.families) {
        const layout = family.mismatch ? "mismatch: another instance recorded a different count" : "agrees";
        rows.push(row([
          el("td", id, { instance: id, field: "id", class: "key" }),
          el("td", family.family, { instance: id, field: "family", class: "key" }),
          cell(num(family.copies), id, "family-copies", { family: family.family }),
          cell(num(family.write_copies), id, "family-writes", { family: family.family }),
          el("td", family.placement + " (window " + family.placement_window + ")", { instance: id, field: "family-placement", family: family.family, title: family.placement_reason }),
          cell(num(family.max_copies), id, "family-max-copies", { family: family.family }),
          el("td", layout, { instance: id, field: "family-layout", family: family.family, class: family.mismatch ? "bad" : "good" }),
          cell(num(family.ttl_ms / 1000, 1), id, "family-ttl", { family: family.family }),
          el("td", family.versioning, { instance: id, field: "family-versioning", family: family.family }),
          el("td", family.default_class, { instance: id, field: "family-class", family: family.family }),
        ]));
      }
    }
    replaceRows("families", rows);
  }

  function render(view) {
    const now = Date.now();
    const members = [];
    for (const member of view.instances) {
      if (member.status) {
        members.push({ id: member.instance.id, status: member.status, samples: record(member.instance.id, member.status, now) });
      }
    }
    for (const id of Array.from(history.keys())) {
      if (!view.instances.some((member) => member.instance.id === id)) {
        history.delete(id);
      }
    }
    const summary = document.getElementById("summary");
    summary.textContent = view.instances.length + " instance" + (view.instances.length === 1 ? "" : "s") +
      "; served by " + view.this + "; updated " + new Date(view.at_ms).toISOString() + ".";
    summary.setAttribute("data-at", String(view.at_ms));
    summary.setAttribute("data-instances", String(view.instances.length));
    const problem = document.getElementById("problem");
    problem.hidden = !view.registry_error;
    problem.textContent = view.registry_error ? "The instance registry cannot be read: " + view.registry_error + ". Only this instance is shown." : "";
    renderInstances(view, now);
    renderQueue(members);
    renderLag(members);
    renderRouting(members);
    renderScrub(members);
    renderNear(members);
    renderHot(members);
    renderFamilies(members);
    document.body.setAttribute("data-rendered", String((Number(document.body.getAttribute("data-rendered")) || 0) + 1));
  }

  async function poll() {
    try {
      const answer = await fetch("v1/fleet", { headers: { Accept: "application/json" }, cache: "no-store" });
      if (!answer.ok) {
        throw new Error("GET /v1/fleet answered " + answer.status);
      }
      const view = await answer.json();
      pollMs = Math.max(MIN_POLL_MS, Number(view.interval_ms) || pollMs);
      failures = 0;
      render(view);
    } catch (err) {
      failures += 1;
      const problem = document.getElementById("problem");
      problem.hidden = false;
      problem.textContent = "Could not refresh (" + failures + " in a row): " + err.message + ". The figures below are from the last successful refresh.";
    }
    setTimeout(poll, pollMs);
  }

  document.getElementById("window").textContent = String(WINDOW_MS / 60000);
  poll();
})();
