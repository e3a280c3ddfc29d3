//! Label selectors (`metav1.LabelSelector`) as NetworkPolicy uses them:
//! `matchLabels` AND every `matchExpressions` requirement. An absent selector
//! is the caller's business (NetworkPolicy gives absent and empty different
//! meanings in peers); an empty one matches everything.
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

/// Labels of an object (absent labels: none).
pub(crate) type Labels = BTreeMap<String, String>;

/// Whether `labels` satisfy `sel`. A requirement with an operator other than
/// `In`, `NotIn`, `Exists` and `DoesNotExist` matches nothing ([`problems`] says so).
pub(crate) fn matches(sel: &LabelSelector, labels: &Labels) -> bool {
    let pairs = sel
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    pairs
        && sel
            .match_expressions
            .iter()
            .flatten()
            .all(|req| requirement(req, labels))
}

fn requirement(req: &LabelSelectorRequirement, labels: &Labels) -> bool {
    let value = labels.get(&req.key);
    let mut values = req.values.iter().flatten();
    match req.operator.as_str() {
        "In" => value.is_some_and(|v| values.any(|x| x == v)),
        // Absent keys satisfy NotIn, as in apimachinery's `labels.Selector`.
        "NotIn" => value.is_none_or(|v| values.all(|x| x != v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        _ => false,
    }
}

/// What is wrong with `sel` (for warnings): each requirement whose operator
/// is unknown (it matches nothing).
pub(crate) fn problems(sel: &LabelSelector) -> Vec<String> {
    sel.match_expressions
        .iter()
        .flatten()
        .filter(|r| {
            !matches!(
                r.operator.as_str(),
                "In" | "NotIn" | "Exists" | "DoesNotExist"
            )
        })
        .map(|r| {
            format!(
                "label selector requirement on {:?} has unknown operator {:?}: it matches nothing",
                r.key, r.operator
            )
        })
        .collect()
}

/// Short text of `sel` in kubectl's notation (`app=web,tier in (a,b),!old`);
/// `any` for the empty selector.
pub(crate) fn describe(sel: &LabelSelector) -> String {
    let mut parts: Vec<String> = sel
        .match_labels
        .iter()
        .flatten()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    for r in sel.match_expressions.iter().flatten() {
        let values = r.values.as_deref().unwrap_or_default().join(",");
        parts.push(match r.operator.as_str() {
            "In" => format!("{} in ({values})", r.key),
            "NotIn" => format!("{} notin ({values})", r.key),
            "Exists" => r.key.clone(),
            "DoesNotExist" => format!("!{}", r.key),
            op => format!("{} {op}? ({values})", r.key),
        });
    }
    if parts.is_empty() {
        "any".to_owned()
    } else {
        parts.join(",")
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn sel(v: serde_json::Value) -> LabelSelector {
        serde_json::from_value(v).unwrap()
    }

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn empty_selector_matches_everything() {
        assert!(matches(&sel(json!({})), &labels(&[])));
        assert!(matches(&sel(json!({})), &labels(&[("a", "b")])));
        assert_eq!(describe(&sel(json!({}))), "any");
    }

    #[test]
    fn match_labels_all_pairs() {
        let s = sel(json!({"matchLabels": {"app": "web", "tier": "fe"}}));
        assert!(matches(
            &s,
            &labels(&[("app", "web"), ("tier", "fe"), ("x", "y")])
        ));
        assert!(!matches(&s, &labels(&[("app", "web")])));
        assert!(!matches(&s, &labels(&[("app", "web"), ("tier", "be")])));
    }

    #[test]
    fn operators() {
        let s = |op: &str, values: &[&str]| {
            sel(json!({"matchExpressions": [{"key": "env", "operator": op, "values": values}]}))
        };
        let prod = labels(&[("env", "prod")]);
        let dev = labels(&[("env", "dev")]);
        let none = labels(&[("other", "x")]);

        let in_ = s("In", &["prod", "staging"]);
        assert!(matches(&in_, &prod));
        assert!(!matches(&in_, &dev));
        assert!(!matches(&in_, &none));

        let not_in = s("NotIn", &["prod"]);
        assert!(!matches(&not_in, &prod));
        assert!(matches(&not_in, &dev));
        assert!(matches(&not_in, &none), "NotIn matches an absent key");

        let exists = s("Exists", &[]);
        assert!(matches(&exists, &prod));
        assert!(!matches(&exists, &none));

        let dne = s("DoesNotExist", &[]);
        assert!(!matches(&dne, &prod));
        assert!(matches(&dne, &none));

        let bad = s("Matches", &["prod"]);
        assert!(!matches(&bad, &prod));
        assert!(!matches(&bad, &none));
        assert_eq!(problems(&bad).len(), 1);
        assert!(problems(&bad)[0].contains("\"Matches\""));
        assert!(problems(&in_).is_empty());
    }

    #[test]
    fn labels_and_expressions_together() {
        let s = sel(json!({
            "matchLabels": {"app": "web"},
            "matchExpressions": [{"key": "env", "operator": "In", "values": ["prod"]}]
        }));
        assert!(matches(&s, &labels(&[("app", "web"), ("env", "prod")])));
        assert!(!matches(&s, &labels(&[("app", "web"), ("env", "dev")])));
        assert!(!matches(&s, &labels(&[("app", "db"), ("env", "prod")])));
        assert_eq!(describe(&s), "app=web,env in (prod)");
    }
}
