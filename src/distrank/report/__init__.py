"""The consistency page of ``distrank report`` (:mod:`distrank.report.html`): a tidy
score table in, one self-contained HTML file out."""
