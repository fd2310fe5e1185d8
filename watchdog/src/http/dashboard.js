// Keeps the page live: fetches the server-rendered fragment of this page
// every data-every milliseconds (1 s unless set) and swaps it in. No
// reload, no external resources. A page without data-fragment stays still.
(function () {
  var live = document.getElementById("live");
  var offline = document.getElementById("offline");
  var url = live.getAttribute("data-fragment");
  if (!url) return;
  var every = parseInt(live.getAttribute("data-every"), 10) || 1000;
  function tick() {
    fetch(url, { cache: "no-store" })
      .then(function (r) { if (!r.ok) throw new Error(r.status); return r.text(); })
      .then(function (html) { live.innerHTML = html; offline.style.display = "none"; })
      .catch(function () { offline.style.display = "block"; })
      .finally(function () { setTimeout(tick, every); });
  }
  setTimeout(tick, every);
})();
