// A small Markdown renderer for model answers, safe by construction: every piece of the text
// is HTML-escaped before any markup is added, and the only markup added is the fixed tags
// below, so model text can never become an element or an attribute of its own. Links are kept
// only to http(s) URLs. It renders a prefix of an answer as well as the whole (the page calls
// it on every streamed piece): an unclosed code fence is code to the end.
//
// Blocks: paragraphs (lines joined by <br>), ATX headings, fenced code, flat lists (- * + and
// 1. 1)), block quotes, rules. Inline: `code`, **bold**, __bold__, *italic*, _italic_,
// ~~struck~~, [text](https://...), bare https:// URLs.
(function () {
  "use strict";

  const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };

  function escapeHtml(text) {
    return String(text).replace(/[&<>"']/g, (c) => ESCAPES[c]);
  }

  // A URL in escaped text: no whitespace and no entity but &amp;, so it can never leave the
  // quoted href it is put in (quotes arrive as &quot; and end it).
  const URL = "https?:\\/\\/(?:[^\\s&<>\\[\\]()]|&amp;)+";
  const LINK = new RegExp(`\\[([^\\]]+)\\]\\((${URL})\\)`, "g");
  const BARE = new RegExp(`(^|[^\\w"/=])(${URL})`, "g");

  function anchor(url, html) {
    return `<a href="${url}" target="_blank" rel="noopener noreferrer">${html}</a>`;
  }

  function emphasis(s) {
    return s
      .replace(/\*\*(?=\S)([\s\S]*?\S)\*\*/g, "<strong>$1</strong>")
      .replace(/(^|[^\w])__(?=\S)([\s\S]*?\S)__(?!\w)/g, "$1<strong>$2</strong>")
      .replace(/\*(?=[^\s*])([^*]*?[^\s*])\*/g, "<em>$1</em>")
      .replace(/(^|[^\w])_(?=[^\s_])([^_]*?[^\s_])_(?!\w)/g, "$1<em>$2</em>")
      .replace(/~~(?=\S)([\s\S]*?\S)~~/g, "<del>$1</del>");
  }

  // Inline markup of one block's escaped text. Code spans and links are set aside first (as
  // \u0000N\u0000, a character stripped from the input) so emphasis never reaches into them:
  // `a_b_c` and https://x/a_b_c stay as written.
  function inline(escaped) {
    const kept = [];
    const keep = (html) => `\u0000${kept.push(html) - 1}\u0000`;
    let s = escaped.replace(/`([^`]+)`/g, (_, code) => keep(`<code>${code}</code>`));
    s = s.replace(LINK, (_, text, url) => keep(anchor(url, emphasis(text))));
    s = s.replace(BARE, (_, before, url) => {
      // Sentence punctuation after a URL is not part of it (the ; of an &amp; is).
      let cut = url;
      while (/[.,:;!?]$/.test(cut) && !cut.endsWith("&amp;")) cut = cut.slice(0, -1);
      return before + keep(anchor(cut, cut)) + url.slice(cut.length);
    });
    // A link's text may hold a code span: restore until none is left.
    const restore = (html) => html.replace(/\u0000(\d+)\u0000/g, (_, i) => restore(kept[Number(i)]));
    return restore(emphasis(s));
  }

  const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([\w+#.-]*)/;
  const HEADING = /^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$/;
  const RULE = /^ {0,3}([-*_])(?:\s*\1){2,}\s*$/;
  const QUOTE = /^ {0,3}>\s?(.*)$/;
  const ITEM = /^\s*([-*+]|(\d{1,9})[.)])\s+(.*)$/;

  function render(source) {
    const lines = String(source).replace(/\u0000/g, "").replace(/\r\n?/g, "\n").split("\n");
    const out = [];
    let paragraph = [];
    let list = null; // { tag, start, items }
    const line = (text) => inline(escapeHtml(text));
    const endParagraph = () => {
      if (paragraph.length) out.push(`<p>${paragraph.map(line).join("<br>")}</p>`);
      paragraph = [];
    };
    const endList = () => {
      if (list) {
        const start = list.tag === "ol" && list.start !== 1 ? ` start="${list.start}"` : "";
        const items = list.items.map((item) => `<li>${line(item)}</li>`).join("");
        out.push(`<${list.tag}${start}>${items}</${list.tag}>`);
      }
      list = null;
    };
    const end = () => {
      endParagraph();
      endList();
    };

    for (let i = 0; i < lines.length; i++) {
      const text = lines[i];
      let m;
      if ((m = FENCE.exec(text))) {
        end();
        const marker = m[1];
        const language = m[2] ? ` class="language-${escapeHtml(m[2])}"` : "";
        const body = [];
        while (++i < lines.length && !lines[i].trim().startsWith(marker)) body.push(lines[i]);
        out.push(`<pre><code${language}>${escapeHtml(body.join("\n"))}</code></pre>`);
      } else if (/^\s*$/.test(text)) {
        end();
      } else if ((m = HEADING.exec(text))) {
        end();
        const n = m[1].length;
        out.push(`<h${n}>${line(m[2])}</h${n}>`);
      } else if (RULE.test(text)) {
        end();
        out.push("<hr>");
      } else if ((m = QUOTE.exec(text))) {
        end();
        const quoted = [m[1]];
        while (i + 1 < lines.length && (m = QUOTE.exec(lines[i + 1]))) {
          quoted.push(m[1]);
          i++;
        }
        out.push(`<blockquote>${render(quoted.join("\n"))}</blockquote>`);
      } else if ((m = ITEM.exec(text))) {
        endParagraph();
        const tag = m[2] === undefined ? "ul" : "ol";
        if (!list || list.tag !== tag) {
          endList();
          list = { tag, start: tag === "ol" ? Number(m[2]) : 1, items: [] };
        }
        list.items.push(m[3]);
      } else if (list && /^\s+\S/.test(text)) {
        // An indented line under an item continues it.
        list.items[list.items.length - 1] += " " + text.trim();
      } else {
        endList();
        paragraph.push(text);
      }
    }
    end();
    return out.join("\n");
  }

  window.NuvecMarkdown = { render, escapeHtml };
})();
