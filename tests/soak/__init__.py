"""The soak (issue 19 §4): ``make soak MINUTES=…`` runs steady mixed load on a
production-shaped private stack while a scheduler injects faults one at a time, logs every
request and observation as a history, and checks the invariants over the whole history.

Modules: ``stack`` (the private stack), ``load`` (the load and the approver), ``faults``
(the fault registry), ``observe`` (observers and the final snapshot), ``history``,
``checker`` (pure), ``report``, ``runner``.
"""
