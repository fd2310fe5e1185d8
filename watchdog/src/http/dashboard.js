// Keeps the page live: fetches the server-rendered fragment of this page
// every second and swaps it in. No reload, no external resources.
(function () {
  var live = document.getElementById("live");
  var offline = document.getElementById("offline");
  var url = live.getAttribute("data-fragment");
  function tick() {
    fetch(url, { cache: "no-store" })
      .then(function (r) { if (!r.ok) throw new Error(r.status); return r.text(); })
      .then(function (html) { live.innerHTML = html; offline.style.display = "none"; })
      .catch(function () { offline.style.display = "block"; })
      .finally(function () { setTimeout(tick, 1000); });
  }
  setTimeout(tick, 1000);
})();
