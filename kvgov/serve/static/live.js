// The live page of kvgov serve: polls /kvgov/v1/live about once a second and draws it.
// Every string from the server goes in through textContent, never as HTML: budget names,
// request ids and event fields come from clients.
"use strict";

(() => {
  const POLL_MS = 1000;
  const KEY_STORE = "kvgov.apiKey";
  const SHARED_LABELS = new Set(["model_name", "engine"]); // the same on every sample
  const BUDGET_COLORS = 8; // live.css has .budget-0 to .budget-7

  const $ = (id) => document.getElementById(id);

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, value);
    for (const child of children) {
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  // The labels that tell a sample from its siblings, as a stable JSON key.
  function ownLabels(labels) {
    const own = {};
    for (const name of Object.keys(labels).sort()) {
      if (!SHARED_LABELS.has(name)) own[name] = labels[name];
    }
    return JSON.stringify(own);
  }

  function fmtBytes(n) {
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
    return (i === 0 ? String(n) : n.toFixed(1)) + " " + units[i];
  }

  function fmtValue(value, format) {
    if (format === "percent") return (value * 100).toFixed(1) + "%";
    return Number.isInteger(value) ? String(value) : String(Number(value.toPrecision(6)));
  }

  // One element per figure: data-metric and data-labels say which sample, data-value
  // holds the number exactly as /kvgov/v1/live sent it.
  function metricCell(tag, name, labels, value, format) {
    const node = el(tag, { "data-metric": name, "data-labels": labels });
    setFigure(node, value, format);
    return node;
  }

  function setFigure(node, value, format) {
    node.setAttribute("data-value", String(value));
    node.textContent = fmtValue(value, format);
  }

  function renderSummary(byKey) {
    for (const node of document.querySelectorAll("#summary [data-metric]")) {
      const key = node.dataset.metric + " " + node.dataset.labels;
      if (byKey.has(key)) setFigure(node, byKey.get(key), node.dataset.format);
    }
  }

  function renderMetrics(samples) {
    const rows = samples.map((s) => {
      const labels = ownLabels(s.labels);
      const shown = Object.entries(JSON.parse(labels)).map(([k, v]) => k + '="' + v + '"');
      return el("tr", {}, el("td", {}, s.name), el("td", {}, shown.join(", ")),
        metricCell("td", s.name, labels, s.value));
    });
    $("metrics").tBodies[0].replaceChildren(...rows);
  }

  // A bar's part, as wide as its share; labelled inside when there is room for it.
  function segment(kind, cls, label, amount, total, title) {
    const node = el("div", { class: "seg " + cls, title: label + ": " + title });
    node.style.flexGrow = String(amount);
    node.dataset.kind = kind;
    if (amount / total > 0.08) node.textContent = label;
    return node;
  }

  function blockSegment(s, cls, total) {
    const node = segment(s.kind, cls, s.label, s.blocks, total, s.blocks + " blocks");
    node.dataset.blocks = String(s.blocks);
    return node;
  }

  function renderMemory(memory) {
    const colorOf = new Map(memory.budgets.map((b, i) => [b.name, "budget-" + (i % BUDGET_COLORS)]));
    const classOf = (s) => (s.kind === "budget" ? colorOf.get(s.label) : s.kind);

    const device = memory.weights_bytes + memory.kv_bytes;
    $("device-caption").textContent = "Device: weights " + fmtBytes(memory.weights_bytes) +
      ", KV cache " + fmtBytes(memory.kv_bytes) + " (" + memory.num_blocks + " blocks of " +
      memory.block_size + " tokens, " + fmtBytes(memory.bytes_per_block) + " each)";
    const weights = segment("weights", "weights", "weights", memory.weights_bytes, device,
      fmtBytes(memory.weights_bytes));
    const kv = segment("kv", "kv", "KV cache", memory.kv_bytes, device, fmtBytes(memory.kv_bytes));
    $("device-bar").replaceChildren(weights, kv);

    const blocks = memory.device.filter((s) => s.blocks > 0);
    $("blocks-caption").textContent = "KV cache: " + memory.num_blocks + " blocks";
    $("blocks-bar").replaceChildren(
      ...blocks.map((s) => blockSegment(s, classOf(s), memory.num_blocks)));
    $("blocks-legend").replaceChildren(...memory.device.map((s) => el("li", {},
      el("i", { class: "swatch " + classOf(s) }), s.label + ": ",
      el("b", { "data-segment": s.kind, "data-label": s.label }, String(s.blocks)))));

    const offloaded = memory.host.reduce((sum, s) => sum + s.blocks, 0);
    $("host-caption").textContent = "Host memory: " + offloaded + " of " +
      memory.num_host_blocks + " blocks offloaded";
    const free = Math.max(0, memory.num_host_blocks - offloaded);
    const hostTotal = memory.num_host_blocks || 1;
    const host = memory.host.filter((s) => s.blocks > 0)
      .map((s) => blockSegment(s, classOf(s), hostTotal));
    host.push(blockSegment({ kind: "empty", label: "free", blocks: free }, "empty", hostTotal));
    $("host-bar").replaceChildren(...host);
  }

  function renderBudgets(budgets) {
    const rows = budgets.map((b) => {
      const at = (where) => JSON.stringify({ budget: b.name, where: where });
      return el("tr", {}, el("td", {}, b.name),
        metricCell("td", "kvgov:budget_blocks", at("device"), b.device_blocks),
        metricCell("td", "kvgov:budget_tokens", at("device"), b.device_tokens),
        metricCell("td", "kvgov:budget_blocks", at("host"), b.host_blocks),
        metricCell("td", "kvgov:budget_tokens", at("host"), b.host_tokens),
        metricCell("td", "kvgov:budget_max_blocks", JSON.stringify({ budget: b.name }),
          b.max_blocks));
    });
    $("budgets").tBodies[0].replaceChildren(...rows);
  }

  function renderProcesses(processes) {
    const rows = processes.map((p) => el("tr", {}, el("td", {}, p.process),
      el("td", {}, String(p.leases)), el("td", {}, String(p.device_blocks)),
      el("td", {}, String(p.max_blocks))));
    $("processes").tBodies[0].replaceChildren(...rows);
  }

  // With API keys the server lists only this key's requests and counts the others.
  function renderRequests(requests, notListed) {
    const rows = requests.map((r) => el("tr", { "data-request": r.request_id, "data-state": r.state },
      el("td", {}, r.request_id), el("td", {}, r.state), el("td", {}, r.budget ?? "-"),
      el("td", {}, r.priority), el("td", {}, r.num_prompt_tokens),
      el("td", {}, r.num_output_tokens), el("td", {}, r.num_cached_tokens)));
    $("requests").tBodies[0].replaceChildren(...rows);
    const note = $("requests-note");
    note.hidden = !notListed;
    note.dataset.notListed = String(notListed || 0);
    note.textContent = notListed ? notListed + " more, not this API key's" : "";
  }

  function renderEvents(events) {
    const items = events.slice().reverse().map((e) => {
      const { seq, at, kind, ...fields } = e;
      const detail = Object.entries(fields)
        .filter(([, v]) => v !== "" && v !== null) // no tenant without API keys
        .map(([k, v]) => k + "=" + JSON.stringify(v));
      const time = new Date(at * 1000).toLocaleTimeString();
      return el("li", { "data-seq": seq, "data-kind": kind }, el("time", {}, time), " ",
        el("b", {}, kind), " ", el("span", { class: "muted" }, detail.join(" ")));
    });
    $("events").replaceChildren(...items);
  }

  function render(view) {
    const byKey = new Map(view.metrics.map((s) => [s.name + " " + ownLabels(s.labels), s.value]));
    $("model").textContent = view.model + " · instance " + view.instance_id.slice(0, 8);
    renderSummary(byKey);
    renderMemory(view.memory);
    renderBudgets(view.memory.budgets);
    renderProcesses(view.memory.processes);
    renderRequests(view.requests, view.num_requests_not_listed);
    renderEvents(view.events);
    renderMetrics(view.metrics);
    const updated = $("updated");
    updated.dataset.updates = String(Number(updated.dataset.updates) + 1);
    updated.textContent = "updated " + new Date().toLocaleTimeString();
  }

  function setStatus(state, text) {
    const status = $("status");
    status.dataset.state = state;
    status.textContent = text;
  }

  async function poll() {
    const headers = { Accept: "application/json" };
    const key = sessionStorage.getItem(KEY_STORE);
    if (key) headers.Authorization = "Bearer " + key;
    try {
      const response = await fetch("/kvgov/v1/live",
        { headers: headers, cache: "no-store", credentials: "omit" });
      if (response.status === 401 || response.status === 403) {
        $("key-form").hidden = false;
        setStatus("key", key ? "key refused" : "API key needed");
      } else if (!response.ok) {
        setStatus("error", "error " + response.status);
      } else {
        const view = await response.json();
        $("key-form").hidden = true;
        try {
          render(view);
          setStatus("live", "live");
        } catch (error) {
          setStatus("error", "cannot draw: " + error);
        }
      }
    } catch (error) {
      setStatus("down", "server not answering");
    } finally {
      setTimeout(poll, POLL_MS);
    }
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("key-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const key = $("key").value.trim();
      if (key) sessionStorage.setItem(KEY_STORE, key);
      $("key").value = "";
    });
    $("forget-key").addEventListener("click", () => sessionStorage.removeItem(KEY_STORE));
    poll();
  });
})();
