// The dashboard's only script, served by the dashboard itself (the policy allows no
// other, and no inline code): shows each time in the viewer's own time zone, and every
// few seconds fetches the page again and puts the fresh copy of each part marked
// data-live in place (counts, lists, a job's status and attempts), until paused. The
// fetched page is parsed inert (DOMParser runs nothing); every value in it is escaped
// text already.
(function () {
  "use strict";
  var EVERY = 5000;
  var KEY = "asyncq-live-paused";

  function pad(n) {
    return (n < 10 ? "0" : "") + n;
  }

  function localTimes(root) {
    var times = root.querySelectorAll("time[datetime]");
    for (var i = 0; i < times.length; i++) {
      var t = times[i];
      var d = new Date(t.getAttribute("datetime"));
      if (isNaN(d.getTime())) continue;
      t.title = t.textContent;
      t.textContent = d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) +
        " " + pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds());
    }
  }

  // What the reader unfolded (an attempt's error, its logs) stays unfolded.
  function keepOpen(old, fresh) {
    var was = old.querySelectorAll("details");
    var now = fresh.querySelectorAll("details");
    for (var i = 0; i < was.length && i < now.length; i++) {
      now[i].open = was[i].open;
    }
  }

  function paused() {
    try {
      return window.localStorage.getItem(KEY) === "1";
    } catch (e) {
      return false;
    }
  }

  function setPaused(on) {
    try {
      window.localStorage.setItem(KEY, on ? "1" : "0");
    } catch (e) { /* private mode: the toggle lasts for this page only */ }
    state.paused = on;
    show();
  }

  var state = { paused: paused(), busy: false };
  var toggle, stamp;

  function show() {
    toggle.textContent = state.paused ? "Live: paused" : "Live: on";
    toggle.setAttribute("aria-pressed", state.paused ? "true" : "false");
    toggle.title = state.paused ? "Resume refreshing this page" : "Pause refreshing this page";
    document.documentElement.setAttribute("data-live-state", state.paused ? "paused" : "on");
  }

  function refresh() {
    if (state.paused || state.busy || document.hidden) return;
    state.busy = true;
    fetch(window.location.href, { credentials: "same-origin", headers: { "X-Asyncq-Live": "1" } })
      .then(function (reply) {
        if (!reply.ok) throw new Error(String(reply.status));
        return reply.text();
      })
      .then(function (html) {
        var fresh = new DOMParser().parseFromString(html, "text/html");
        var parts = document.querySelectorAll("[data-live][id]");
        for (var i = 0; i < parts.length; i++) {
          var found = fresh.getElementById(parts[i].id);
          if (!found) continue;
          var copy = document.importNode(found, true);
          localTimes(copy);
          keepOpen(parts[i], copy);
          parts[i].replaceWith(copy);
        }
        var now = new Date();
        stamp.textContent = "updated " + pad(now.getHours()) + ":" + pad(now.getMinutes()) +
          ":" + pad(now.getSeconds());
        document.documentElement.setAttribute("data-refreshed", String(now.getTime()));
      })
      .catch(function () {
        stamp.textContent = "not updated (the dashboard did not answer)";
      })
      .then(function () {
        state.busy = false;
      });
  }

  function start() {
    localTimes(document);
    var header = document.querySelector("header");
    var zone = "";
    try {
      zone = Intl.DateTimeFormat().resolvedOptions().timeZone || "";
    } catch (e) { /* no Intl: the times are in local time all the same */ }
    var box = document.createElement("span");
    box.className = "live";
    toggle = document.createElement("button");
    toggle.type = "button";
    toggle.id = "live-toggle";
    toggle.addEventListener("click", function () {
      setPaused(!state.paused);
      if (!state.paused) refresh();
    });
    stamp = document.createElement("span");
    stamp.id = "live-stamp";
    var where = document.createElement("span");
    where.id = "time-zone";
    where.textContent = zone ? "times in " + zone : "local times";
    box.appendChild(where);
    box.appendChild(toggle);
    box.appendChild(stamp);
    if (header) header.appendChild(box);
    show();
    window.setInterval(refresh, EVERY);
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
