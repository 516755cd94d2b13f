"""The consistency page of ``distrank report`` (:mod:`distrank.report.html`, its verdicts
from :mod:`distrank.report.verdicts`): a tidy score table in, one self-contained HTML file
out."""
