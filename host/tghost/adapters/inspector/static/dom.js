// dom: the one helper both scripts build the page with.
"use strict";

window.TghostDom = {
  // A new element: attributes (text, className, on<event> handlers; undefined/null/false ones
  // left out, true as an empty attribute) and children (null/undefined left out).
  el(tag, attrs = {}, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs)) {
      if (value === undefined || value === null || value === false) continue;
      if (key === "text") node.textContent = value;
      else if (key === "className") node.className = value;
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? "" : value);
    }
    for (const child of children) if (child !== null && child !== undefined) node.append(child);
    return node;
  },
};
