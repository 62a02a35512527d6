"""nbgrader's listing of its exchange, logged only when what it lists changes.

Formgrader asks nbgrader which assignments are released on every page and API call (and, with
none released, once per assignment), and each time nbgrader's ExchangeList writes "Released
assignments:" and one line per lab to the server's log: dozens of identical blocks in `make
lab`'s output. This subclass lists exactly as nbgrader does and logs the first listing and each
one that differs from the previous (a lab released or taken back, a new submission), once per
server. `instructor_config` selects it through nbgrader's own hook (ExchangeFactory.list).
"""
from __future__ import annotations

import logging

from nbgrader.exchange.default.list import ExchangeList as NbgraderExchangeList


class ExchangeList(NbgraderExchangeList):
    _logged: dict[tuple, tuple[str, ...]] = {}   # what each kind of listing last logged, per process

    def list_files(self):
        assignments = self.parse_assignments()
        if self.inbound or self.cached:
            lines = tuple(self.format_inbound_assignment(info) for a in assignments for info in a["submissions"])
        else:
            lines = tuple(self.format_outbound_assignment(info) for info in assignments)
        key = (self.root, self.cache, self.coursedir.course_id, self.coursedir.assignment_id, self.inbound, self.cached)
        if ExchangeList._logged.get(key) == lines:
            return assignments
        if self.log.isEnabledFor(logging.INFO):   # a listing nobody saw (a quiet logger) is not "logged"
            ExchangeList._logged[key] = lines
        return super().list_files()   # nbgrader's own listing and log lines
