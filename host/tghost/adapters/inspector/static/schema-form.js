// schema-form: a call form drawn from a tool's JSON Schema (the subset tool schemas use):
// string, number, integer, boolean, enum (and const), nested objects, arrays, defaults,
// required fields, local $ref into $defs/definitions, and the "X or null" anyOf that pydantic
// writes for optional arguments. What it cannot draw (other anyOf/oneOf/allOf, tuples, maps) is
// a JSON text field for that value.
"use strict";

(function () {
  let serial = 0;
  const nextId = (name) => `f${++serial}-${String(name).replace(/[^A-Za-z0-9_-]/g, "_")}`;

  // Values are kept by argument name in plain objects, and any name is an argument's: read only
  // an object's own keys ({}["__proto__"] is Object.prototype) and build objects with
  // Object.fromEntries (value["__proto__"] = v sets the prototype, or does nothing).
  const own = (object, key) => (object !== null && typeof object === "object" && Object.hasOwn(object, key) ? object[key] : undefined);
  const valuesOf = (fields) => Object.fromEntries(fields.map(([key, f]) => [key, f.get()]).filter(([, v]) => v !== undefined));

  function resolve(schema, root, depth = 0) {
    if (!schema || typeof schema !== "object" || depth > 20) return schema || {};
    if (typeof schema.$ref === "string" && schema.$ref.startsWith("#/")) {
      let target = root;
      for (const part of schema.$ref.slice(2).split("/")) target = own(target, part.replace(/~1/g, "/").replace(/~0/g, "~"));
      const { $ref, ...rest } = schema;
      return resolve({ ...(target || {}), ...rest }, root, depth + 1);
    }
    const options = schema.anyOf || schema.oneOf;
    if (Array.isArray(options) && options.length === 2) {  // "X or null": an optional X
      const other = options.filter((o) => !(o && o.type === "null"));
      if (other.length === 1) {
        const { anyOf, oneOf, ...rest } = schema;
        return { ...resolve(other[0], root, depth + 1), ...rest, nullable: true };
      }
    }
    return schema;
  }

  function kindOf(schema) {
    if (Array.isArray(schema.enum) || "const" in schema) return "enum";
    if (schema.anyOf || schema.oneOf || schema.allOf) return "json";
    let type = schema.type;
    if (Array.isArray(type)) {
      const real = type.filter((t) => t !== "null");
      type = real.length === 1 ? real[0] : undefined;
    }
    if (type === "object" && !schema.properties) return "json";
    if (type === "array" && (Array.isArray(schema.items) || schema.prefixItems)) return "json";
    return ["string", "number", "integer", "boolean", "object", "array"].includes(type) ? type : (schema.properties ? "object" : "json");
  }

  const { el } = window.TghostDom;

  function help(schema, id) {
    const parts = [];
    if (schema.description) parts.push(schema.description);
    if (schema.default !== undefined) parts.push(`Default: ${JSON.stringify(schema.default)}`);
    return parts.length ? el("small", { id, className: "help", text: parts.join(" · ") }) : null;
  }

  // A field for one value: { node, get() -> value (undefined = leave out), set(value) }.
  function field(name, rawSchema, root, required) {
    const schema = resolve(rawSchema, root);
    const kind = kindOf(schema);
    if (kind === "object") return objectField(name, schema, root, required);
    if (kind === "array") return arrayField(name, schema, root, required);
    const id = nextId(name), helpId = `${id}-help`;
    const label = el("label", { for: id, text: name });
    const marker = required ? el("span", { className: "required", text: "required", "aria-hidden": "true" }) : null;
    const note = help(schema, helpId);
    const common = { id, name, "aria-describedby": note ? helpId : undefined, "aria-required": required ? "true" : undefined };
    let input, get, set;
    if (kind === "enum") {
      const values = Array.isArray(schema.enum) ? schema.enum : [schema.const];
      input = el("select", common);
      if (!required || schema.default === undefined) input.append(el("option", { value: "", text: required ? "choose…" : "(none)" }));
      values.forEach((value, i) => input.append(el("option", { value: String(i), text: JSON.stringify(value) === `"${value}"` ? String(value) : JSON.stringify(value) })));
      get = () => (input.value === "" ? undefined : values[Number(input.value)]);
      set = (value) => { const i = values.findIndex((v) => JSON.stringify(v) === JSON.stringify(value)); input.value = i < 0 ? "" : String(i); };
    } else if (kind === "boolean") {
      input = el("input", { ...common, type: "checkbox" });
      let touched = false;
      input.addEventListener("change", () => { touched = true; });
      get = () => (touched || required || schema.default !== undefined ? input.checked : undefined);
      set = (value) => { input.checked = Boolean(value); touched = value !== undefined; };
    } else if (kind === "number" || kind === "integer") {
      input = el("input", { ...common, type: "number", step: kind === "integer" ? "1" : "any",
                            min: schema.minimum, max: schema.maximum, inputmode: kind === "integer" ? "numeric" : "decimal" });
      get = () => {
        if (input.value.trim() === "") return input.validity.badInput ? input.value : undefined;
        const number = Number(input.value);
        return Number.isFinite(number) ? number : input.value;  // the host says what is wrong
      };
      set = (value) => { input.value = value === undefined || value === null ? "" : String(value); };
    } else if (kind === "string") {
      const long = schema.maxLength === undefined || schema.maxLength > 200;
      input = long && /text|content|body|query|prompt|code|document/i.test(name)
        ? el("textarea", { ...common, rows: "3" })
        : el("input", { ...common, type: "text", maxlength: schema.maxLength, pattern: schema.pattern });
      get = () => (input.value === "" && !required ? undefined : input.value);
      set = (value) => { input.value = value === undefined || value === null ? "" : String(value); };
    } else {
      input = el("textarea", { ...common, rows: "3", spellcheck: "false", placeholder: "JSON", className: "json" });
      get = () => {
        if (input.value.trim() === "") return undefined;
        try { return JSON.parse(input.value); } catch { return input.value; }
      };
      set = (value) => { input.value = value === undefined ? "" : JSON.stringify(value, null, 2); };
    }
    if (schema.default !== undefined) set(schema.default);
    const node = el("div", { className: `field kind-${kind}` }, el("div", { className: "label-row" }, label, marker), input, note);
    return { node, get, set };
  }

  function objectField(name, schema, root, required) {
    const needed = new Set(schema.required || []);
    const fields = Object.entries(schema.properties || {}).map(([key, sub]) => [key, field(key, sub, root, needed.has(key))]);
    const legend = el("legend", { text: name });
    const note = help(schema, nextId(name) + "-help");
    const node = el("fieldset", { className: "object" }, legend, note, ...fields.map(([, f]) => f.node));
    return {
      node,
      get() {
        const value = valuesOf(fields);
        return Object.keys(value).length || required ? value : undefined;
      },
      set(value) { for (const [key, f] of fields) f.set(own(value, key)); },
    };
  }

  function arrayField(name, schema, root, required) {
    const items = [];
    const list = el("ol", { className: "items" });
    const add = el("button", { type: "button", className: "small", text: `Add ${name} item` });
    const node = el("fieldset", { className: "array" }, el("legend", { text: name }), help(schema, nextId(name) + "-help"), list, add);
    function push(value) {
      const index = items.length;
      const item = field(`${name}[${index}]`, schema.items || {}, root, true);
      const remove = el("button", { type: "button", className: "small quiet", text: "Remove", "aria-label": `Remove ${name} item ${index + 1}` });
      const li = el("li", {}, item.node, remove);
      const entry = { item, li };
      remove.addEventListener("click", () => { items.splice(items.indexOf(entry), 1); li.remove(); });
      items.push(entry);
      list.append(li);
      if (value !== undefined) item.set(value);
      return item;
    }
    add.addEventListener("click", () => { push(); const first = list.lastElementChild.querySelector("input, select, textarea"); if (first) first.focus(); });
    const api = {
      node,
      get() {
        const values = items.map((e) => e.item.get()).filter((v) => v !== undefined);
        return values.length || required ? values : undefined;
      },
      set(value) { items.splice(0).forEach((e) => e.li.remove()); (Array.isArray(value) ? value : []).forEach((v) => push(v)); },
    };
    if (Array.isArray(schema.default)) api.set(schema.default);
    return api;
  }

  // The form of a tool's whole input schema (an object schema): { node, get(), set(value) }.
  function build(schema) {
    const root = schema || {};
    const top = resolve(root, root);
    if (kindOf(top) !== "object") return field("arguments", top, root, true);
    const needed = new Set(top.required || []);
    const fields = Object.entries(top.properties || {}).map(([key, sub]) => [key, field(key, sub, root, needed.has(key))]);
    const node = el("div", { className: "fields" }, ...fields.map(([, f]) => f.node));
    if (!fields.length) node.append(el("p", { className: "empty", text: "This tool takes no arguments." }));
    return {
      node,
      get() { return valuesOf(fields); },
      set(value) { for (const [key, f] of fields) f.set(own(value, key)); },
    };
  }

  window.SchemaForm = { build, resolve };
})();
