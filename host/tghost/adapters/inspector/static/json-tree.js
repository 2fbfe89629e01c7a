// json-tree: a structured result (the JSON object a tool with an output-schema answers) as a
// collapsible tree: each object and array a <details> (open to OPEN_DEPTH levels), each value
// with its key and its type, in text.
"use strict";

(function () {
  const { el } = window.TghostDom;
  const OPEN_DEPTH = 3;  // levels shown open at first; deeper ones start folded

  // The value's JSON type: "object", "array", "string", "number", "boolean" or "null".
  const typeOf = (value) => (value === null ? "null" : Array.isArray(value) ? "array" : typeof value);

  // Any key is a value's key, "__proto__" too: JSON.parse makes it an own property, and
  // Object.entries reads own properties only. Nothing here indexes a value by a key, nor
  // builds an object from keys.
  const entries = (value) => (Array.isArray(value) ? value.map((item, i) => [String(i), item]) : Object.entries(value));

  const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;

  function summary(value, type) {
    return type === "array" ? `array · ${plural(value.length, "item")}` : `object · ${plural(Object.keys(value).length, "key")}`;
  }

  function shown(value, type) {
    if (type === "object") return "{}";
    if (type === "array") return "[]";
    return type === "string" ? JSON.stringify(value) : String(value);
  }

  // One entry: a <li> with the key (an array's index), then the value and its type, or, for a
  // non-empty object or array, a <details> whose summary says its type and size.
  function entry(key, value, index, depth) {
    const type = typeOf(value);
    const label = [el("span", { className: index ? "key index" : "key", text: key === "" ? '""' : key }),
                   el("span", { className: "punct", text: ": " })];
    const items = type === "object" || type === "array" ? entries(value) : [];
    if (!items.length) {
      return el("li", { className: "entry leaf" }, ...label,
        el("span", { className: `value ${type}`, text: shown(value, type) }), " ",
        el("span", { className: "type", text: type }));
    }
    return el("li", { className: "entry branch" },
      el("details", { open: depth < OPEN_DEPTH },
        el("summary", {}, ...label, el("span", { className: "type", text: summary(value, type) })),
        el("ul", {}, ...items.map(([k, v]) => entry(k, v, type === "array", depth + 1)))));
  }

  // The tree of a JSON object or array (as JSON.parse gives it): a <ul> of its entries.
  function build(value) {
    const type = typeOf(value);
    return el("ul", { className: "json-tree", "aria-label": `structured result, ${summary(value, type)}` },
      ...entries(value).map(([k, v]) => entry(k, v, type === "array", 1)));
  }

  window.JsonTree = { build };
})();
