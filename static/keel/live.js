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
  document.addEventListener("DOMContentLoaded", function () {
    if (!window.htmx) return;
    // Each (re)connection asks for what happened after the page's last event.
    htmx.createWebSocket = function (url) {
      return new WebSocket(url.replace(/after=\d+/, "after=" + lastSeq()));
    };
    document.body.addEventListener("htmx:wsOpen", function () { state(true); });
    document.body.addEventListener("htmx:wsClose", function () { state(false); });
    document.body.addEventListener("htmx:wsError", function () { state(false); });
  });
})();
