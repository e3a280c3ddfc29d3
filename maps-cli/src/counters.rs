//! `sluicectl counters`: why packets were redirected, passed or dropped.
use anyhow::Result;
use serde_json::{Map, Value};

use crate::{
    args::{JsonArgs, Target},
    bpf::Datapath,
    table,
};

pub fn execute(t: &Target, a: &JsonArgs) -> Result<()> {
    let counters = Datapath::open(t)?.counters()?;
    if a.json {
        let m: Map<String, Value> = counters
            .iter()
            .map(|(k, v)| ((*k).to_string(), Value::from(*v)))
            .collect();
        println!("{}", serde_json::to_string_pretty(&m)?);
    } else {
        let rows: Vec<Vec<String>> = counters
            .iter()
            .map(|(k, v)| vec![(*k).to_string(), v.to_string()])
            .collect();
        print!("{}", table::render(&["REASON", "PACKETS"], &rows));
    }
    Ok(())
}
