use parsley::*;

fn t(name: &str) -> Topic<String, String> {
    Topic::new(name, Codec::utf8(), Codec::utf8())
}

#[test]
fn fan_in_holds_until_cause() {
    let (c1, c2, out) = (t("c1"), t("c2"), t("out"));
    let (o1, o2) = (out.clone(), out.clone());
    let join = Stage::named("join")
        .state(Codec::utf8(), String::new)
        .fold(&c1, move |s: String, m: &Message<String, String>| {
            let next = format!("{s}L{}", m.value().unwrap());
            Step::to(next.clone()).emit(o1.send(m.key().cloned(), next))
        })
        .fold(&c2, move |s: String, m: &Message<String, String>| {
            let next = format!("{s}R{}", m.value().unwrap());
            Step::to(next.clone()).emit(o2.send(m.key().cloned(), next))
        })
        .sink(&out)
        .build()
        .unwrap();
    let app = Parsley::named("app", [join]).unwrap();
    let mut d = TestDriver::new(&app).unwrap();
    let cause = d.next_coordinate(&c1, "k").unwrap();
    d.pipe_input(&c2, Input::new("k", "b").after(&cause)).unwrap();
    let held = d.held();
    assert_eq!(held.len(), 1, "{held:?}");
    println!("{}", held[0]);
    assert!(d.values(&out).unwrap().is_empty());
    d.pipe(&c1, "k", "a").unwrap();
    assert!(d.held().is_empty());
    assert_eq!(d.values(&out).unwrap(), vec!["La".to_string(), "LaRb".to_string()]);
    println!("{:#?}", d.deliveries());
    let st: Option<String> = d.fold_state("join", &Codec::utf8(), "k").unwrap();
    assert_eq!(st.as_deref(), Some("LaRb"));
    let recs = d.records(&out).unwrap();
    for r in &recs {
        println!("{:?} {:?}", r.coordinate, r.causal());
    }
    assert_eq!(d.markers("out", 0).unwrap(), 1);
}
