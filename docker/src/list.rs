//! `ipkeep-docker list`: every pool's addresses, who holds them and until when — the
//! `kubectl get ipr` of Docker users.

use crate::decide::{self, Holder};
use crate::driver::ListedAddress;

/// The table `list` prints, columns aligned; `now` decides "retained until" against "expired".
pub fn render(addresses: &[ListedAddress], now: u64) -> String {
    let mut rows: Vec<[String; 4]> = vec![[
        "POOL".into(),
        "ADDRESS".into(),
        "NAME".into(),
        "STATE".into(),
    ]];
    for a in addresses {
        let name = match &a.holder {
            Holder::Named(key) => match key.mac() {
                Some(mac) => format!("(MAC {mac})"),
                None => key.id().to_owned(),
            },
            Holder::Gateway => "(gateway)".into(),
            Holder::Unnamed(_) => "(no name)".into(),
            Holder::Foreign => "(not ipkeep-docker's)".into(),
        };
        let state = match a.retained_until {
            None => "in use".to_owned(),
            Some(until) if until > now => format!("retained until {}", decide::until_text(until)),
            Some(until) => format!(
                "retention ended {} (freed by the next request)",
                decide::until_text(until)
            ),
        };
        rows.push([a.pool_id.clone(), a.ip.to_string(), name, state]);
    }
    let width = |col: usize| rows.iter().map(|r| r[col].len()).max().unwrap_or(0);
    let widths = [width(0), width(1), width(2)];
    let mut out = String::new();
    for row in &rows {
        let line = format!(
            "{:w0$}  {:w1$}  {:w2$}  {}",
            row[0],
            row[1],
            row[2],
            row[3],
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2]
        );
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::decide::StickyKey;

    #[test]
    fn table() {
        let ip = |s: &str| ipkeep_hostlocal::addr::parse_ip(s).unwrap();
        let row = |a: &str, holder: Holder, until: Option<u64>| ListedAddress {
            pool_id: "ipkeep-local_198.18.5.0-24".into(),
            ip: ip(a),
            holder,
            retained_until: until,
        };
        let listed = [
            row("198.18.5.1", Holder::Gateway, None),
            row(
                "198.18.5.2",
                Holder::Named(StickyKey::parse("web-1").unwrap()),
                None,
            ),
            row(
                "198.18.5.3",
                Holder::Named(StickyKey::parse("db").unwrap()),
                Some(86_400),
            ),
            row("198.18.5.4", Holder::Unnamed("u1".into()), None),
            row(
                "198.18.5.5",
                Holder::Named(StickyKey::from_mac("02:42:c6:12:05:05").unwrap()),
                None,
            ),
        ];
        assert_eq!(
            render(&listed, 0),
            "POOL                        ADDRESS     NAME                     STATE\n\
             ipkeep-local_198.18.5.0-24  198.18.5.1  (gateway)                in use\n\
             ipkeep-local_198.18.5.0-24  198.18.5.2  web-1                    in use\n\
             ipkeep-local_198.18.5.0-24  198.18.5.3  db                       retained until 1970/01/02 00:00:00 UTC\n\
             ipkeep-local_198.18.5.0-24  198.18.5.4  (no name)                in use\n\
             ipkeep-local_198.18.5.0-24  198.18.5.5  (MAC 02:42:c6:12:05:05)  in use\n"
        );
        assert!(render(&listed, 86_400).contains("retention ended 1970/01/02 00:00:00 UTC"));
    }
}
