/* zones: tables a phone can read.
 *
 * Each body cell of a table in the article gets its column's header as `data-label`. At a
 * phone's width (zones.css: below 600 px) a table marked `zones-cards` (the scorecard), or one
 * that is wider than its box, shows each row as a card with one labelled field per line, so no
 * column hides behind a scroll bar and the caption wraps in the column.
 */
(function () {
  "use strict";
  var PHONE = "(max-width: 600px)";
  var TABLES = "article table";

  function headerNames(table) {
    // one name per column: the header rows' texts joined ("k = 1 · Δloss"), a blank header
    // cell taking the text of the cell before it in its row (a label repeated under a group)
    var rows = table.tHead ? Array.prototype.slice.call(table.tHead.rows) : [];
    var names = [];
    rows.forEach(function (row) {
      var previous = "";
      Array.prototype.forEach.call(row.cells, function (cell, i) {
        var text = cell.textContent.replace(/#$/, "").trim() || previous;
        previous = text;
        names[i] = names[i] && text && names[i] !== text ? names[i] + " · " + text : (text || names[i] || "");
      });
    });
    return names;
  }

  function label(table) {
    var names = headerNames(table);
    Array.prototype.forEach.call(table.tBodies, function (body) {
      Array.prototype.forEach.call(body.rows, function (row) {
        Array.prototype.forEach.call(row.cells, function (cell, i) {
          if (names[i] && !cell.hasAttribute("data-label")) cell.setAttribute("data-label", names[i]);
        });
      });
    });
  }

  function fit() {
    var phone = window.matchMedia(PHONE).matches;
    document.querySelectorAll(TABLES).forEach(function (table) {
      table.classList.remove("zones-as-cards");
      if (!phone) return;
      var box = table.parentElement;
      if (table.classList.contains("zones-cards") || box.scrollWidth > box.clientWidth + 1 ||
          table.getBoundingClientRect().width > box.getBoundingClientRect().width + 1) {
        table.classList.add("zones-as-cards");
      }
    });
  }

  var timer = null;
  function start() {
    document.querySelectorAll(TABLES).forEach(label);
    fit();
    window.addEventListener("resize", function () {
      clearTimeout(timer);
      timer = setTimeout(fit, 100);
    });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
