"""MySQL and MariaDB for the Jdbc connector: the dialect's URLs and sessions (``urls``,
``sessions``), its types (``types``), reading splits as Arrow batches (``source``) and the sink's
writers (``writers``). One driver, PyMySQL, for both servers (docs/decisions/0035)."""
