/**
 * DOM building at the edge: an element factory, and kernel text with its
 * backticked parts as code. Nothing here is ever parsed as HTML.
 */

/** Element factory: `h('div', {class: 'x'}, 'text', child)`. */
export function h(
  tag: string,
  attrs: { [name: string]: string | null } = {},
  ...children: (Node | string | null)[]
): HTMLElement {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value !== null) {
      node.setAttribute(name, value);
    }
  }
  for (const child of children) {
    if (child !== null) {
      node.append(child);
    }
  }
  return node;
}

/**
 * A line of kernel text with its backticked parts as `<code>`: DOM nodes
 * only, the text is never parsed as HTML.
 */
export function renderCodeText(text: string): DocumentFragment {
  const fragment = document.createDocumentFragment();
  const parts = text.split('`');
  // an odd number of backticks leaves the last one as text
  const closed = parts.length % 2 === 1 ? parts.length : parts.length - 1;
  parts.forEach((part, i) => {
    if (i % 2 === 1 && i < closed) {
      fragment.append(h('code', {}, part));
    } else {
      fragment.append((i % 2 === 1 ? '`' : '') + part);
    }
  });
  return fragment;
}
