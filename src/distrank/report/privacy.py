"""The report page's account of a private ranking (``distrank rank``'s metadata): the
privacy of each site, which adjacent pairs the noise leaves unresolved, and the tied
ranks those pairs make (``metrics.sketch.confidence``)."""

from __future__ import annotations

from collections.abc import Mapping

from distrank.report.markup import esc, num, section


def unresolved(meta: Mapping) -> dict[str, list[dict]]:
    """aggregation -> the adjacent pairs of the confidence table not resolved at its level."""
    pairs = (meta.get("confidence") or {}).get("pairs") or []
    out: dict[str, list[dict]] = {}
    for p in pairs:
        if not p["resolved"]:
            out.setdefault(p["aggregation"], []).append(p)
    return out


def tied_ranks(meta: Mapping, aggregation: str) -> dict[str, str]:
    """model -> its rank, models joined by an unresolved pair sharing one ("1-3"); {} when
    the metadata holds no confidence table."""
    pairs = [
        p
        for p in (meta.get("confidence") or {}).get("pairs") or []
        if p["aggregation"] == aggregation
    ]
    if not pairs:
        return {}
    order = [pairs[0]["model"]] + [p["next"] for p in pairs]
    groups, current = [], [order[0]]
    for p in pairs:  # in order: rank 1's pair first
        if p["resolved"]:
            groups.append(current)
            current = [p["next"]]
        else:
            current.append(p["next"])
    groups.append(current)
    out, first = {}, 1
    for group in groups:
        last = first + len(group) - 1
        label = str(first) if last == first else f"{first}\u2013{last}"
        out |= dict.fromkeys(group, label)
        first = last + 1
    return out


def privacy_facts(meta: Mapping) -> list[tuple[str, str]]:
    """Header lines of a sketch table: its map and each site's privacy."""
    about = meta.get("sketch")
    if not about:
        return []
    m = about.get("map") or {}
    facts = [
        (
            "sketch map",
            f"rbf, bandwidth {m.get('bandwidth')}, D = {m.get('dim')}, seed {m.get('seed')}",
        )
    ]
    sites = []
    for name, s in (about.get("sites") or {}).items():
        noise = (
            f"epsilon {s['epsilon']:g}, delta {s['delta']:g}, noise std {s['noise_std']:.3g}"
            if s.get("epsilon")
            else "no noise"
        )
        sites.append(f"{name} ({s.get('n')} rows): {noise}")
    facts.append(("privacy", "; ".join(sites)))
    return facts


def privacy_section(meta: Mapping) -> str:
    """Which pairs the noise leaves unresolved, and how sure each order is."""
    conf = meta.get("confidence")
    if not conf:
        return ""
    level, open_ = conf["level"], unresolved(meta)
    items = []
    for agg in ("all", "avg"):
        pairs = open_.get(agg, [])
        whole = (conf.get("order") or {}).get(agg)
        rows = "".join(
            f'<tr data-aggregation="{agg}"><td>{esc(p["model"])}</td><td>{esc(p["next"])}</td>'
            f"<td class=num>{num(p['gap'])}</td><td class=num>{num(p['noise_std'])}</td>"
            f"<td class=num>{p['p_order']:.3f}</td></tr>"
            for p in pairs
        )
        head = (
            f"<p><b>{agg}</b>: the whole order holds with probability "
            f"{whole:.3f}; {len(pairs)} adjacent pair{'s' * (len(pairs) != 1)} "
            f"unresolved at level {level:g}.</p>"
        )
        table = (
            '<table class="unresolved"><thead><tr><th>model</th><th>next</th><th>gap</th>'
            "<th>noise std of the gap</th><th>P(order)</th></tr></thead>"
            f"<tbody>{rows}</tbody></table>"
            if pairs
            else ""
        )
        items.append(head + table)
    bias = (meta.get("sketch") or {}).get("bias_removed")
    note = (
        f"<p>Values are unbiased: each noisy sketch's expected excess (here {num(bias)} on "
        "the pooled sketch, the same for every model) is removed. P(order) is the "
        "probability that the noiseless sketches order the pair as shown; models joined by "
        "an unresolved pair share a rank.</p>"
        if bias
        else ""
    )
    return section("privacy", "What the noise leaves unresolved", "".join(items) + note)
