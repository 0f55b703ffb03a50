// The cluster page's drain buttons: each opens the confirmation dialog for its member (the form
// in the dialog carries the CSRF token and the reason; the rows themselves are redrawn live).
document.addEventListener("click", (event) => {
  const dialog = document.getElementById("drain-dialog");
  if (!dialog) return;
  const open = event.target.closest("[data-action='drain']");
  if (open) {
    dialog.querySelector("form").action = open.dataset.drainUrl;
    dialog.querySelector("[data-field='memberName']").textContent = open.dataset.memberName;
    dialog.showModal();
    dialog.querySelector("input[name='reason']").focus();
    return;
  }
  if (event.target.closest("[data-action='drain-cancel']")) dialog.close();
});
