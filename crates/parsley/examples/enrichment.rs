//! Customer enrichment: profiles and orders, both JSON, joined in fold
//! state per customer; a per-customer order count; a summary every minute
//! from a tick that reads every customer's state; and a dead-letter topic
//! for records that are not valid JSON. Run it with
//! `cargo run -p parsley --example enrichment`.
//!
//! It runs in the broker-less TestDriver and checks what it prints: an
//! order whose producer saw the profile first is held until that profile
//! is delivered here, so it is never enriched as "unknown customer".

use std::time::Duration;

use parsley::{
    Codec, DEAD_LETTER_ERROR, DEAD_LETTER_OFFSET, Decoded, Input, Parsley, Stage, Step, TestDriver,
    Topic,
};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
struct Profile {
    name: String,
    tier: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
struct Order {
    id: String,
    total: i64,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
struct Enriched {
    order: String,
    total: i64,
    customer: String,
    tier: String,
}

/// What the stage remembers per customer.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
struct Customer {
    profile: Option<Profile>,
    orders: u64,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // ANCHOR: topics
    // Producers we do not control may write anything: decoding is allowed
    // to fail as data, and the malformed records go to the dead letters.
    let customers: Topic<String, Decoded<Profile>> =
        Topic::new("customers", Codec::utf8(), Codec::attempting(Codec::json()));
    let orders: Topic<String, Decoded<Order>> =
        Topic::new("orders", Codec::utf8(), Codec::attempting(Codec::json()));
    let enriched: Topic<String, Enriched> =
        Topic::new("orders-enriched", Codec::utf8(), Codec::json::<Enriched>());
    let summaries: Topic<String, String> =
        Topic::new("customer-summaries", Codec::utf8(), Codec::utf8());
    let dead: Topic<String, Vec<u8>> = Topic::new("enrichment-dlq", Codec::utf8(), Codec::bytes());
    // ANCHOR_END: topics

    // ANCHOR: customers
    let mut builder = Stage::named("enrich").state(Codec::json::<Customer>(), Customer::default);
    let (out, summary, dlq) = (
        builder.add_sink(&enriched),
        builder.add_sink(&summaries),
        builder.add_sink(&dead),
    );
    let state = builder.store(Codec::utf8());
    let stage = builder
        .fold(&customers, move |customer, m| match m.value() {
            Some(Decoded::Ok(profile)) => Step::to(Customer {
                profile: Some(profile.clone()),
                ..customer
            }),
            Some(Decoded::Malformed { raw, reason }) => Step::keep().emit(
                dlq.send(m.key().cloned(), raw.clone())
                    .dead_letter(m, reason),
            ),
            None => Step::keep(),
        })
        // ANCHOR_END: customers
        .fold(&orders, move |customer, m| match m.value() {
            Some(Decoded::Ok(order)) => {
                let (name, tier) = customer.profile.as_ref().map_or_else(
                    || ("unknown customer".to_owned(), "none".to_owned()),
                    |p| (p.name.clone(), p.tier.clone()),
                );
                let line = Enriched {
                    order: order.id.clone(),
                    total: order.total,
                    customer: name,
                    tier,
                };
                Step::to(Customer {
                    orders: customer.orders + 1,
                    ..customer
                })
                .emit(out.send(m.key().cloned(), line))
            }
            Some(Decoded::Malformed { raw, reason }) => Step::keep().emit(
                dlq.send(m.key().cloned(), raw.clone())
                    .dead_letter(m, reason),
            ),
            None => Step::keep(),
        })
        // ANCHOR: tick
        // Every minute: orders per customer, read from the keyed state.
        .tick_fold_over(
            Duration::from_secs(60),
            Codec::utf8(),
            move |tick_state, tick, customers| {
                let counts: Vec<String> = customers
                    .iter()
                    .map(|(id, c)| format!("{}={}", id.unwrap_or_default(), c.orders))
                    .collect();
                Step::to(tick_state).emit(summary.send(
                    None,
                    format!("at {}: {}", tick.timestamp(), counts.join(" ")),
                ))
            },
        )
        // ANCHOR_END: tick
        .build()?;
    let app = Parsley::named("shop", [stage])?;

    let mut driver = TestDriver::new(&app)?;
    let ann = Profile {
        name: "Ann".into(),
        tier: "gold".into(),
    };
    driver.pipe(&customers, "c-ann", Decoded::Ok(ann))?;
    driver.pipe(
        &orders,
        "c-ann",
        Decoded::Ok(Order {
            id: "o-1".into(),
            total: 120,
        }),
    )?;

    // ANCHOR: held
    // Bob's order was placed by a service that had just read Bob's new
    // profile: it is stamped as caused by it. The profile is still on its
    // way here, so the order is held rather than enriched without it.
    let bob_profile = driver.next_coordinate(&customers, "c-bob")?;
    driver.pipe_input(
        &orders,
        Input::new(
            "c-bob",
            Decoded::Ok(Order {
                id: "o-2".into(),
                total: 40,
            }),
        )
        .after(&bob_profile),
    )?;
    let held = driver.held();
    assert_eq!(held.len(), 1);
    println!("held: {}", held[0]);
    driver.pipe(
        &customers,
        "c-bob",
        Decoded::Ok(Profile {
            name: "Bob".into(),
            tier: "silver".into(),
        }),
    )?;
    assert!(driver.held().is_empty());
    // ANCHOR_END: held

    // ANCHOR: malformed
    // A producer wrote something that is not JSON.
    driver.pipe(
        &orders,
        "c-ann",
        Decoded::Malformed {
            raw: b"{\"id\": \"o-3\", total".to_vec(),
            reason: String::new(),
        },
    )?;
    // ANCHOR_END: malformed

    driver.advance_wall_clock(Duration::from_secs(60))?;

    let lines = driver.read_values(&enriched)?;
    for l in &lines {
        println!(
            "enriched: {} {} for {} ({})",
            l.order, l.total, l.customer, l.tier
        );
    }
    let names: Vec<&str> = lines.iter().map(|l| l.customer.as_str()).collect();
    assert_eq!(
        names,
        vec!["Ann", "Bob"],
        "no order enriched without its profile"
    );

    // ANCHOR: dead-letters
    let dead_letters = driver.read_all(&dead)?;
    assert_eq!(dead_letters.len(), 1);
    let header = |name: &str| {
        dead_letters[0]
            .header(name)
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .unwrap_or_default()
    };
    println!(
        "dead letter: orders offset {} ({})",
        header(DEAD_LETTER_OFFSET),
        header(DEAD_LETTER_ERROR)
    );
    assert_eq!(header(DEAD_LETTER_OFFSET), "2");
    // ANCHOR_END: dead-letters

    let summary_lines = driver.read_values(&summaries)?;
    println!("summary: {}", summary_lines.join(" | "));
    assert_eq!(summary_lines, vec!["at 60000: c-ann=1 c-bob=1".to_string()]);
    assert_eq!(driver.state(&state, "c-ann")?.map(|c| c.orders), Some(1));
    println!("ok: every order enriched with its profile; malformed input dead-lettered");
    Ok(())
}
