"""The report page's account of a private ranking (the metadata of ``distrank rank`` or
``distrank score --private``): the privacy of each site or client, which adjacent pairs
the noise leaves unresolved, and the tied ranks those pairs make
(``metrics.sketch._confidence``)."""

from __future__ import annotations

from collections.abc import Mapping

from distrank.report.markup import esc, num, section


def noisy_metric(meta: Mapping) -> str | None:
    """The metric whose ranking carries noise (the metadata's confidence), or None."""
    return (meta.get("confidence") or {}).get("metric")


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
    """Header lines of a private table: a sketch table's map and each site's privacy, or
    the budget and noise of ``score --private``'s releases."""
    about = meta.get("sketch")
    if not about:
        return _release_facts(meta.get("privacy"))
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


def _release_facts(privacy: Mapping | None) -> list[tuple[str, str]]:
    """``score --private``'s budget (each client's) and the noise std of its releases, or
    each Flower site's guarantee in words."""
    if not privacy:
        return []
    if "epsilon" not in privacy:  # a Flower table: what each site attested
        sites = privacy.get("sites") or {}
        return [("privacy", "; ".join(f"{s}: {g}" for s, g in sites.items()))] if sites else []
    clients = privacy.get("client_noise_std") or {}
    budget = (
        f"each client epsilon {privacy['epsilon']:g}, delta {privacy['delta']:g} over "
        f"{privacy['n_releases']} releases (Gaussian mechanism, noise multiplier "
        f"{privacy['noise_multiplier']:.4g})"
    )
    noise = "; ".join(f"{c}: {s:.3g}" for c, s in clients.items())
    facts = [("privacy", budget)]
    if noise:
        facts.append(("noise std per client release", noise))
    if privacy.get("avg_noise_std") is not None:
        facts.append(("noise std of each avg", f"{privacy['avg_noise_std']:.3g}"))
    return facts


def private_values_section(scores, meta: Mapping, name) -> str:
    """The ``avg`` value and rank of every model of a ``score --private`` table, lowest
    first; models joined by an unresolved pair share a rank (:func:`tied_ranks`)."""
    level = meta["confidence"]["level"]
    avg = scores[(scores["aggregation"] == "avg") & (scores["metric"] == "kd")]
    avg = avg.sort_values("value", kind="mergesort")
    ranks = tied_ranks(meta, "avg")
    rows = "".join(
        f'<tr data-model="{esc(r.model)}"><td>{esc(r.model)}</td>'
        f"<td class=num>{num(r.value)}</td><td class=num>{ranks.get(r.model, '1')}</td></tr>"
        for r in avg.itertuples()
    )
    shown = esc(name("kd"))
    weights = (meta.get("options") or {}).get("weights")
    pooled = "would rank the models as the pooled data do (Theorem 1)" + (
        ""
        if weights == "size"
        else f" under the weights n_i/n, not these ({esc(weights or 'not recorded')})"
    )
    body = (
        f'<table class="values"><thead><tr><th>model</th><th class=num>{shown} avg '
        "&darr;</th><th class=num>rank</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
    )
    return section(
        "values",
        f"Private scores: {shown} avg per model",
        body,
        f"<p>Each client released its {shown} of every model with Gaussian noise (the "
        "privacy lines above); avg is the clients' weighted mean of the noisy values, the "
        f"only aggregate the server forms. Without the noise, {shown}_avg {pooled}; with "
        "it, the ranking holds only where the noise separates the models: models joined "
        f"by a pair unresolved at level {level:g} share a rank (1 = best).</p>",
    )


def privacy_section(meta: Mapping) -> str:
    """Which pairs the noise leaves unresolved, and how sure each order is."""
    conf = meta.get("confidence")
    if not conf:
        return ""
    level, open_ = conf["level"], unresolved(meta)
    items = []
    for agg in [a for a in ("all", "avg") if a in (conf.get("order") or {})]:
        pairs = open_.get(agg, [])
        whole = conf["order"][agg]
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
        else "<p>P(order) is the probability that the noiseless scores order the pair as "
        "shown; models joined by an unresolved pair share a rank.</p>"
    )
    return section("privacy", "What the noise leaves unresolved", "".join(items) + note)
