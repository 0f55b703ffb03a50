// Live pages: the socket resumes from the last event the page showed, and the page says
// whether it is live (pushed) or polling (the fallback while the socket is down).
(function () {
  function lastSeq() {
    var marker = document.getElementById("live-seq");
    return marker ? marker.getAttribute("data-seq") : "0";
  }
  function state(live) {
    document.body.classList.toggle("live", live);
    document.querySelectorAll(".live-state .text").forEach(function (el) {
      el.textContent = live ? "live" : "reconnecting… (refreshing every 5 s)";
    });
  }
  // A live update re-renders a whole fragment: what the reader opened (a traceback, a
  // checkpoint's acknowledgements: details[data-keep-open]) stays open, and a scrolled box
  // (data-keep-scroll) keeps its place, or its end when it was at its end (the newest lines).
  var opened = {};
  function boxes() { return document.querySelectorAll("[data-keep-scroll]"); }
  function atEnd(box) { return box.scrollHeight - box.scrollTop - box.clientHeight < 4; }
  function keepAcrossSwaps() {
    var scroll = {};
    document.addEventListener("toggle", function (event) {
      var key = event.target.getAttribute && event.target.getAttribute("data-keep-open");
      if (key) opened[key] = event.target.open;
    }, true);
    function before() {
      boxes().forEach(function (box) {
        scroll[box.getAttribute("data-keep-scroll")] = atEnd(box) ? "end" : box.scrollTop;
      });
    }
    function after() {
      document.querySelectorAll("details[data-keep-open]").forEach(function (el) {
        if (opened[el.getAttribute("data-keep-open")]) el.open = true;
      });
      boxes().forEach(function (box) {
        var place = scroll[box.getAttribute("data-keep-scroll")];
        box.scrollTop = place === undefined || place === "end" ? box.scrollHeight : place;
      });
    }
    ["htmx:oobBeforeSwap", "htmx:beforeSwap"].forEach(function (name) {
      document.body.addEventListener(name, before);
    });
    ["htmx:oobAfterSwap", "htmx:afterSwap"].forEach(function (name) {
      document.body.addEventListener(name, after);
    });
    after();  // the first load: a log box starts at its newest lines
  }
  document.addEventListener("DOMContentLoaded", function () {
    if (!window.htmx) return;
    // Each (re)connection asks for what happened after the page's last event.
    htmx.createWebSocket = function (url) {
      return new WebSocket(url.replace(/after=\d+/, "after=" + lastSeq()));
    };
    keepAcrossSwaps();
    document.body.addEventListener("htmx:wsOpen", function () { state(true); });
    document.body.addEventListener("htmx:wsClose", function () { state(false); });
    document.body.addEventListener("htmx:wsError", function () { state(false); });
  });
})();
