// kiln report: highlights the rollout the address names and its row; the
// views themselves show by CSS (:target), so the page works without it.
(function () {
  "use strict";
  function select() {
    var sel = document.querySelectorAll("tr.sel");
    for (var i = 0; i < sel.length; i++) sel[i].classList.remove("sel");
    var id = decodeURIComponent(location.hash.slice(1));
    if (id.indexOf("r-") !== 0) return;
    var links = document.querySelectorAll('a.rl[href="#' + id + '"]');
    for (var j = 0; j < links.length; j++) {
      var tr = links[j].closest("tr");
      if (tr) tr.classList.add("sel");
      var det = links[j].closest("details");
      if (det) det.open = true;
    }
    var view = document.getElementById(id);
    if (view) view.scrollIntoView();
  }
  window.addEventListener("hashchange", select);
  select();
})();
