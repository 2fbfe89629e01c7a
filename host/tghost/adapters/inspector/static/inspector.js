// inspector: draws the live directory from /api/events (server-sent events), each tool by its
// title and with its hints, and calls tools through /api/call (a destructive one once
// confirmed), streaming each chunk into the output log as it arrives; a structured result is
// then drawn as a tree (json-tree.js).
"use strict";

(function () {
  const $ = (id) => document.getElementById(id);
  const MARK_MS = 2500;   // how long a change stays marked
  const HISTORY = 12;     // calls kept in the history

  const view = {
    snap: null,
    offset: 0,            // server clock minus ours, seconds
    tools: new Map(),     // name -> the tool's JSON, as last drawn
    marks: new Map(),     // name -> "added" | "changed" | "removed", until MARK_MS passes
    gone: new Map(),      // name -> a removed tool still shown, marked
    selected: null,
    form: null,
    running: null,        // AbortController of the call in flight
    pending: null,        // a destructive tool's call, waiting for "Confirm call"
    history: JSON.parse(sessionStorage.getItem("tghost-history") || "[]"),
  };

  const { el } = window.TghostDom;

  const chip = (text, className = "", title) => el("span", { className: `chip ${className}`, text, title });
  const now = () => Date.now() / 1000 + view.offset;
  const titleOf = (tool) => tool.title || tool.name;
  const hint = (tool, key) => (tool.annotations && Object.hasOwn(tool.annotations, key) ? tool.annotations[key] : undefined);

  // A tool's behaviour hints as badges, in words (the colour only repeats them). Only hints the
  // tool sets are shown; a false one only where it says more than leaving it out: MCP takes an
  // unset destructive and open-world hint for true, so "not destructive" and "not open-world"
  // are news, while an unset read-only or idempotent hint is already false.
  const HINTS = [
    ["read-only", "changes nothing", null],
    ["destructive", "may delete or overwrite", "only adds: deletes and overwrites nothing"],
    ["idempotent", "calling it again with the same arguments does nothing more", null],
    ["open-world", "reaches beyond its host: the web, other systems", "stays within its host's own data"],
  ];
  function hintChips(tool) {
    return HINTS.map(([key, yes, no]) => {
      const set = hint(tool, key);
      if (set === true) return chip(key, `hint hint-${key}`, yes);
      return set === false && no ? chip(`not ${key}`, "hint", no) : null;
    }).filter(Boolean);
  }

  function remaining(leaseEnd) {
    const left = Math.round(leaseEnd - now());
    return left >= 0 ? `${left}s left` : `ended ${-left}s ago`;
  }

  // -- the live directory ---------------------------------------------------------------------

  function apply(snap) {
    view.snap = snap;
    view.offset = snap.now - Date.now() / 1000;
    const next = new Map(snap.tools.map((t) => [t.name, t]));
    if (view.tools.size || view.seeded) {
      for (const [name, tool] of next) {
        const before = view.tools.get(name);
        if (!before) mark(name, "added");
        else if (JSON.stringify(before) !== JSON.stringify(tool)) mark(name, "changed");
      }
      for (const [name, tool] of view.tools) if (!next.has(name)) { view.gone.set(name, tool); mark(name, "removed"); }
    }
    view.seeded = true;
    for (const name of next.keys()) view.gone.delete(name);
    view.tools = next;
    drawHeader(snap);
    drawTools();
    drawHosts(snap);
    if (view.selected) drawGone();
  }

  function applyHosts(hosts) {
    if (!view.snap) return;
    view.snap = { ...view.snap, ...hosts };
    view.offset = hosts.now - Date.now() / 1000;
    drawHeader(view.snap);
    drawHosts(view.snap);
  }

  function mark(name, kind) {
    view.marks.set(name, kind);
    setTimeout(() => {
      if (view.marks.get(name) !== kind) return;
      view.marks.delete(name);
      if (kind === "removed") view.gone.delete(name);
      drawTools();
    }, MARK_MS);
  }

  function drawHeader(snap) {
    $("topic").textContent = snap.topic;
    const live = snap.hosts.filter((h) => h.state === "active").length;
    const rejected = Object.values(snap.rejections).reduce((a, b) => a + b, 0);
    const conflicts = Object.keys(snap.conflicts).length;
    $("counters").textContent = [
      `${snap.tools.length} tool${snap.tools.length === 1 ? "" : "s"}`,
      `${live} live host${live === 1 ? "" : "s"}`,
      conflicts ? `${conflicts} conflict${conflicts === 1 ? "" : "s"}` : null,
      rejected ? `${rejected} rejected` : null,
      snap.identity ? `calling as ${snap.identity}` : "calling anonymously",
    ].filter(Boolean).join(" · ");
  }

  function drawTools() {
    const filter = $("filter").value.trim().toLowerCase();
    const shown = [...view.tools.values(), ...view.gone.values()]
      .filter((t) => !filter || [t.name, t.title, t.description].some((text) => (text || "").toLowerCase().includes(filter)))
      .sort((a, b) => a.name.localeCompare(b.name));
    const list = $("tool-list");
    list.replaceChildren(...shown.map(toolItem));
    $("no-tools").hidden = view.tools.size > 0 || view.gone.size > 0;
  }

  function toolItem(tool) {
    const markKind = view.marks.get(tool.name);
    const descId = `desc-${tool.name}`;
    const chips = el("div", { className: "chips" },
      ...tool.group.map((g) => chip(g, "group")),
      ...(tool.available_in_states || []).map((s) => chip(`in ${s}`, "state")),
      tool.state ? chip(`→ ${tool.state}`, "state") : null,
      ...hintChips(tool),
      tool.conflicts.length ? chip("conflict", "warn") : null,
      tool.policy_mismatch.length ? chip("policy mismatch", "warn") : null,
      (tool.skew || []).length ? chip("skew", "warn") : null,
      tool.admitted ? null : chip("not for you", "warn"));
    return el("li", { className: ["tool", markKind, view.selected === tool.name ? "selected" : ""].join(" ") },
      el("div", { className: "tool-title" },
        el("button", { type: "button", className: tool.title ? "tool-name titled" : "tool-name", "aria-describedby": descId,
                       "aria-current": view.selected === tool.name ? "true" : undefined,
                       onclick: () => select(tool.name), text: titleOf(tool) }),
        tool.title ? el("code", { className: "tool-id", text: tool.name }) : null),
      el("p", { id: descId, className: "tool-desc", text: tool.description || "" }),
      chips,
      el("p", { className: "providers", text: `${tool.providers.length ? tool.providers.join(", ") : "no provider"}` +
                                              (markKind ? ` · ${markKind}` : "") }));
  }

  // A skewed service's versions of its code, in words: "tghost-joke 0.1.0 (code 5cd7fb336cb5) on a; ... on b".
  function skewText(skew) {
    if (!skew || !skew.length) return null;
    return "hosts serve different code: " + skew.map((v) =>
      `${v.distribution || "no distribution"} ${v.version || "(no version)"}` +
      `${v.fingerprint ? ` (code ${v.fingerprint.slice(0, 12)})` : ""} on ${v.hosts.join(", ")}`).join("; ");
  }

  function drawHosts(snap) {
    const list = $("host-list");
    list.replaceChildren(...snap.hosts.map((h) => {
      const services = h.entries.filter((e) => e.kind === "tool-service");
      const withdrawn = h.entries.filter((e) => !e.available);
      const signed = h.signed_by ? (h.verified ? `signed by ${h.signed_by}, verified` : `signed by ${h.signed_by}, not checked`) : "unsigned";
      const late = h.state === "active" && h.host.id in snap.late;
      return el("li", { className: `host ${h.state}` },
        el("div", { className: "host-head" },
          el("strong", { className: "host-id", text: h.host.id }),
          late ? chip("late", "warn", "no heartbeat for half its lease: it may have stopped without withdrawing")
            : chip(h.state, h.state === "active" ? "ok" : "warn")),
        el("p", { className: "host-meta", text: `instance ${h.host.instance || "?"} · ${h.host.hostname || ""} pid ${h.host.pid ?? "?"}` }),
        el("p", { className: "host-meta" },
          el("span", { className: "lease", "data-lease-end": h.lease_end, "data-state": h.state, text: `lease ${h.seconds}s · ${remaining(h.lease_end)}` }),
          document.createTextNode(` · ${signed}`)),
        el("p", { className: "host-meta", text: `services: ${services.filter((e) => e.available).map((e) => e.name).join(", ") || "none"}` }),
        withdrawn.length ? el("p", { className: "host-meta withdrawn", text: `withdrawn: ${withdrawn.map((e) => e.name).join(", ")}` }) : null);
    }));
    const notes = [];
    for (const [name, losers] of Object.entries(snap.conflicts)) notes.push(`conflict over ${name}: ${losers.join(", ")} lost`);
    for (const [host, instances] of Object.entries(snap.clashes)) notes.push(`host id ${host} is announced by ${instances.length} live processes`);
    for (const [host, heard] of Object.entries(snap.late)) notes.push(`host ${host} is late: not heard for ${Math.round(now() - heard)}s`);
    for (const [reason, count] of Object.entries(snap.rejections)) notes.push(`${count} announcement(s) rejected: ${reason}`);
    for (const [reason, count] of Object.entries(snap.refusals)) notes.push(`${count} call(s) refused here: ${reason}`);
    $("directory-notes").replaceChildren(...notes.map((text) => el("p", { text })));
  }

  function tick() {
    for (const node of document.querySelectorAll("[data-lease-end]")) {
      const text = node.textContent.split(" · ")[0];
      node.textContent = `${text} · ${remaining(Number(node.dataset.leaseEnd))}`;
    }
  }

  // -- one tool, its form and its calls -------------------------------------------------------

  function select(name) {
    dismiss();
    view.selected = name;
    const tool = view.tools.get(name) || view.gone.get(name);
    $("pick").hidden = true;
    $("tool").hidden = false;
    $("tool-name").textContent = titleOf(tool);
    $("tool-name").classList.toggle("titled", Boolean(tool.title));
    $("tool-id").textContent = tool.name;
    $("tool-id").hidden = !tool.title;
    const hints = hintChips(tool);
    $("tool-hints").replaceChildren(el("span", { className: "visually-hidden", text: "Hints:" }), ...hints);
    $("tool-hints").hidden = !hints.length;
    $("tool-description").textContent = tool.description || "";
    const facts = $("tool-facts");
    const fact = (term, value) => value ? [el("dt", { text: term }), el("dd", { text: value })] : [];
    facts.replaceChildren(
      ...fact("service", tool.service),
      ...fact("groups", tool.group.join(", ")),
      ...fact("available in states", (tool.available_in_states || ["any"]).join(", ")),
      ...fact("moves to state", tool.state),
      ...fact("result", tool["output-schema"] ? "structured: a JSON object (output-schema)" : null),
      ...fact("config", Object.keys(tool.config || {}).length ? JSON.stringify(tool.config) : null),
      ...fact("providers", tool.plugins.map((p) => `${p.host}${p.plugin ? ` (${p.plugin}${p.version ? " " + p.version : ""})` : ""}`).join(", ")),
      ...fact("access", tool.access),
      ...fact("conflicts", tool.conflicts.length ? tool.conflicts.map((c) => c.host || JSON.stringify(c)).join("; ") : null),
      ...fact("access policies", tool.policy_mismatch.length
        ? tool.policy_mismatch.map((p) => `${p.policy} on ${p.hosts.join(", ")}`).join("; ") + ": hosts admit only what all of them admit"
        : null),
      ...fact("skew", skewText(tool.skew)));
    view.form = window.SchemaForm.build(tool["input-schema"]);
    $("fields").replaceChildren(view.form.node);
    $("raw-toggle").checked = false;
    $("raw-wrap").hidden = true;
    $("fields").hidden = false;
    drawGone();
    drawTools();
    const first = $("fields").querySelector("input, select, textarea");
    if (first) first.focus();
  }

  function drawGone() {
    $("tool-gone").hidden = view.tools.has(view.selected);
  }

  function argumentsNow() {
    if (!$("raw-toggle").checked) return view.form.get();
    return JSON.parse($("raw").value || "{}");
  }

  function toggleRaw() {
    const raw = $("raw-toggle").checked;
    if (raw) $("raw").value = JSON.stringify(view.form.get(), null, 2);
    else {
      try { view.form.set(JSON.parse($("raw").value || "{}")); } catch { /* keep the form as it was */ }
    }
    $("raw-wrap").hidden = !raw;
    $("fields").hidden = raw;
  }

  function call(event) {
    event.preventDefault();
    if (view.running) return;
    const log = $("log");
    let args;
    try { args = argumentsNow(); } catch (err) {
      log.replaceChildren(el("p", { className: "error", text: `The JSON does not parse: ${err.message}` }));
      return;
    }
    const groups = $("groups").value.split(",").map((g) => g.trim()).filter(Boolean);
    const body = { tool: view.selected, arguments: args, groups: groups.length ? groups : null, state: $("state").value.trim() || null };
    if (hint(view.tools.get(view.selected) || view.gone.get(view.selected), "destructive") === true) ask(body);
    else run(body);
  }

  // A destructive tool's call waits for a second click: "Confirm call" makes it; "Cancel", any
  // change to the form or picking another tool drops it.
  function ask(body) {
    view.pending = body;
    $("confirm-text").textContent = `${body.tool} is hinted destructive: it may delete or overwrite. ` +
                                    `Call it with ${JSON.stringify(body.arguments)}?`;
    $("confirm").hidden = false;
    $("call").disabled = true;
    $("confirm-cancel").focus();
  }

  function dismiss() {
    if (!view.pending) return;
    view.pending = null;
    $("confirm").hidden = true;
    $("call").disabled = false;
  }

  function confirmed() {
    const body = view.pending;
    dismiss();
    if (!body || view.running) return;
    run(body);
    $("stop").focus();
  }

  async function run(body) {
    const log = $("log");
    const args = body.arguments;
    const out = el("pre", { className: "observation" });
    log.replaceChildren(el("p", { className: "call-head", text: `${body.tool} ${JSON.stringify(args)}` }), out);
    if (window.matchMedia("(max-width: 1100px)").matches) log.scrollIntoView({ block: "nearest" });  // stacked panels
    $("timing").textContent = "calling…";
    const entry = { tool: body.tool, arguments: args, status: "…", at: new Date().toLocaleTimeString() };
    view.running = new AbortController();
    $("call").disabled = true;
    $("stop").disabled = false;
    let chunks = 0;
    try {
      const response = await fetch("/api/call", { method: "POST", headers: { "Content-Type": "application/json" },
                                                  body: JSON.stringify(body), signal: view.running.signal });
      if (!response.ok && response.headers.get("content-type") !== "application/x-ndjson") {
        throw new Error(`${response.status} ${await response.text()}`);
      }
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        let newline;
        while ((newline = buffer.indexOf("\n")) >= 0) {
          const line = JSON.parse(buffer.slice(0, newline));
          buffer = buffer.slice(newline + 1);
          if (line.progress) {
            showProgress(log, line.progress);
          } else if (line.structured) {
            showStructured(out, line.structured);
          } else if ("chunk" in line) {
            chunks += 1;
            out.append(el("span", { className: "chunk", text: line.chunk }));
            $("timing").textContent = `${chunks} chunk${chunks === 1 ? "" : "s"} · ${line.ms} ms`;
          } else if (line.done) {
            entry.status = "ok";
            entry.first = line.done.first_chunk_ms;
            entry.total = line.done.total_ms;
            $("timing").textContent = `first chunk ${line.done.first_chunk_ms ?? "—"} ms · total ${line.done.total_ms} ms · ${chunks} chunk${chunks === 1 ? "" : "s"}`;
          } else if (line.error) {
            entry.status = line.error.type;
            entry.total = line.total_ms;
            log.append(el("p", { className: "error" }, el("strong", { text: line.error.type }), document.createTextNode(`: ${line.error.message}`), ...errorWhere(line.error)));
            $("timing").textContent = `failed after ${line.total_ms} ms`;
          }
        }
      }
    } catch (err) {
      if (err.name === "AbortError") {
        entry.status = "stopped";
        log.append(el("p", { className: "error", text: "Stopped." }));
        $("timing").textContent = "stopped";
      } else {
        entry.status = "error";
        log.append(el("p", { className: "error", text: `The call could not be made: ${err.message}` }));
        $("timing").textContent = "";
      }
    } finally {
      view.running = null;
      $("call").disabled = false;
      $("stop").disabled = true;
      remember(entry);
    }
  }

  // A progress update (docs/protocol.md §2.12): one bar and line in the log, updated in place.
  function showProgress(log, update) {
    let box = log.querySelector(".progress");
    if (!box) {
      box = el("div", { className: "progress" }, el("progress", { max: 1 }), el("span"));
      log.querySelector(".call-head").after(box);
    }
    const bar = box.querySelector("progress");
    const known = update.total !== null && update.total > 0;
    if (known) bar.value = Math.min(update.done / update.total, 1); else bar.removeAttribute("value");
    bar.setAttribute("aria-label", "progress");
    const amount = known ? `${update.done}/${update.total} (${Math.round(100 * update.done / update.total)}%)` : `${update.done}`;
    box.querySelector("span").textContent = update.message ? `${amount} ${update.message}` : amount;
  }

  // Where an error came from (docs/protocol.md §2.6): the host that answered and the request id its log names.
  function errorWhere(error) {
    const known = [["host", error.host], ["request", error.request_id]].filter(([, value]) => value);
    if (!known.length) return [];
    return [el("small", { className: "where", text: known.map(([label, value]) => `${label} ${value}`).join(" · ") })];
  }

  // A structured result: its tree, and "raw JSON" to see the observation as it came instead.
  function showStructured(out, value) {
    const tree = window.JsonTree.build(value);
    const raw = el("input", { type: "checkbox", onchange: () => { out.hidden = !raw.checked; tree.hidden = raw.checked; } });
    out.hidden = true;
    out.before(el("div", { className: "structured" }, el("label", { className: "check" }, raw, "raw JSON"), tree));
  }

  function remember(entry) {
    view.history.unshift(entry);
    view.history.length = Math.min(view.history.length, HISTORY);
    sessionStorage.setItem("tghost-history", JSON.stringify(view.history));
    drawHistory();
  }

  function drawHistory() {
    $("history").replaceChildren(...view.history.map((h) => el("li", { className: h.status === "ok" ? "ok" : "failed" },
      el("button", { type: "button", className: "link", onclick: () => replay(h),
                     text: `${h.tool} ${JSON.stringify(h.arguments)}` }),
      el("span", { className: "meta", text: ` ${h.status}${h.total !== undefined ? ` · ${h.total} ms` : ""} · ${h.at}` }))));
  }

  function replay(entry) {
    if (!view.tools.has(entry.tool) && !view.gone.has(entry.tool)) return;
    select(entry.tool);
    view.form.set(entry.arguments);
  }

  // -- start ----------------------------------------------------------------------------------

  function connect() {
    const events = new EventSource("/api/events");
    events.addEventListener("directory", (e) => apply(JSON.parse(e.data)));
    events.addEventListener("hosts", (e) => applyHosts(JSON.parse(e.data)));
    events.addEventListener("open", () => { document.body.dataset.live = "true"; $("status-text").textContent = "live"; });
    events.addEventListener("error", () => { document.body.dataset.live = "false"; $("status-text").textContent = "reconnecting…"; });
  }

  $("filter").addEventListener("input", drawTools);
  $("raw-toggle").addEventListener("change", toggleRaw);
  $("call-form").addEventListener("submit", call);
  $("call-form").addEventListener("input", dismiss);
  $("call-form").addEventListener("change", dismiss);
  $("confirm-call").addEventListener("click", confirmed);
  $("confirm-cancel").addEventListener("click", () => { dismiss(); $("call").focus(); });
  $("stop").addEventListener("click", () => view.running && view.running.abort());
  setInterval(tick, 1000);
  drawHistory();
  connect();
})();
