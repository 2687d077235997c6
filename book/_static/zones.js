/* zones: tables a phone can read.
 *
 * Each body cell of a table in the article gets its column's header as `data-label`. A table
 * wider than its box is set in smaller type (`zones-compact`, then `zones-tiny`); one still too wide, or one
 * marked `zones-cards` (the scorecard) at a phone's width, shows each row as a card with one
 * labelled field per line (`zones-as-cards`), so no column hides behind a scroll bar and the
 * caption wraps in the column.
 *
 * A dropdown (a solution) opens and closes on a tap anywhere on its title, its link included.
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
          if (!cell.textContent.trim()) cell.classList.add("zones-blank");   // a card leaves it out
        });
      });
    });
  }

  function fits(table) {
    var box = table.parentElement;
    return box.scrollWidth <= box.clientWidth + 1 &&
           table.getBoundingClientRect().width <= box.getBoundingClientRect().width + 1;
  }

  // A table never hides a column: as it is if it fits its box; else in smaller type, one step
  // then another (zones-compact, zones-tiny); else, or always at a phone's width when marked
  // zones-cards, as cards.
  var SMALLER = ["zones-compact", "zones-tiny"];
  function fitTable(table, phone) {
    table.classList.remove("zones-as-cards", "zones-compact", "zones-tiny");
    if (phone && table.classList.contains("zones-cards")) { table.classList.add("zones-as-cards"); return; }
    if (fits(table)) return;
    for (var i = 0; i < SMALLER.length; i++) {
      table.classList.add(SMALLER[i]);
      if (fits(table)) return;
      table.classList.remove(SMALLER[i]);
    }
    table.classList.add("zones-as-cards");
  }

  function fit() {
    var phone = window.matchMedia(PHONE).matches;
    document.querySelectorAll(TABLES).forEach(function (table) { fitTable(table, phone); });
  }

  // A table's box changes width without a window resize: a collapsed solution opens, the page
  // grows a scroll bar. Fit that table again, once per new width, after the layout settles.
  function watch() {
    if (!window.ResizeObserver) return;
    var widths = new WeakMap();
    var observer = new ResizeObserver(function (entries) {
      entries.forEach(function (entry) {
        var width = Math.round(entry.contentRect.width);
        if (widths.get(entry.target) === width) return;
        widths.set(entry.target, width);
        var table = entry.target.querySelector("table");
        if (table) window.requestAnimationFrame(function () {
          fitTable(table, window.matchMedia(PHONE).matches);
        });
      });
    });
    document.querySelectorAll(TABLES).forEach(function (table) { observer.observe(table.parentElement); });
  }

  var timer = null;
  function start() {
    document.querySelectorAll(TABLES).forEach(label);
    fit();
    watch();
    window.addEventListener("load", fit);   // after fonts and formulas have their final size
    window.addEventListener("resize", function () {
      clearTimeout(timer);
      timer = setTimeout(fit, 100);
    });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();

  // A solution's title (sphinx-exercise) holds a link to its exercise: "Solution to Exercise 4".
  // togglebutton.js opens the solution on a click on the title itself, but a click on the link
  // (a third of the title on a phone) finds no button ("button is not defined") and the link
  // carries the reader away. Here a tap anywhere on a dropdown's title opens or closes it: the
  // click is taken before it reaches the link or togglebutton's handler.
  var DROPDOWN_TITLE = ".admonition.dropdown > .admonition-title, .admonition.toggle > .admonition-title";
  document.addEventListener("click", function (event) {
    var title = event.target && event.target.closest ? event.target.closest(DROPDOWN_TITLE) : null;
    if (!title) return;
    var button = title.querySelector(".toggle-button");
    if (!button || typeof window.toggleHidden !== "function") return;
    event.preventDefault();
    event.stopPropagation();
    window.toggleHidden(button);
  }, true);
})();
