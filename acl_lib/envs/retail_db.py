"""The tau2-bench retail database: its schema, its 16 tools, and the gold-action replay.

The schema follows tau2-bench's retail ``db.json`` (products with variants, users with payment methods,
orders with items, fulfillments and payment history). ``RetailDB.load(d).dump() == d`` for the real
file: fields that tau2 leaves out until a tool sets them (``cancel_reason``, ``exchange_*``,
``return_*``) are ``None`` in memory and absent in the dump.

``RetailTools`` (a ``desk.Toolkit``) implements the 15 tau2 tools plus tau3's ``get_item_details`` with the
preconditions, effects and error messages of the tau2-bench retail reference (replayed against its data in
``tests/data/tau2``). A failed precondition raises ``ToolError`` (the agent sees ``Error: <message>``) and a
failed call changes nothing: every check runs before the first write. Each tool also rejects argument values of
the wrong type with a ``ToolError``, so a tool never raises anything else, whatever it is given.

``tool_schemas(compact)`` gives the 16 OpenAI schemas: the reference's wording (paper profile), or the
same signatures with one-line descriptions (mini worlds, ``compact=True``).

``replay(db_dict, task_dict)`` runs a task's gold actions on a fresh copy of a database and reports
which actions raised and which orders and users they changed (the gold end state a task is scored on).
"""

from __future__ import annotations

import ast
import json
import math
import operator
import unicodedata
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from acl_lib.envs.base import ToolError, function_schema
from acl_lib.envs.desk import Toolkit, compact_schemas

# --- schema ---------------------------------------------------------------------------------------


class _Model(BaseModel):
    # extra="forbid": a record with an unknown key would not round-trip, so refuse it at load time
    model_config = ConfigDict(extra="forbid")


class Variant(_Model):
    item_id: str
    options: dict[str, str]
    available: bool
    price: float  # dollars


class Product(_Model):
    name: str
    product_id: str
    variants: dict[str, Variant]  # item_id -> variant


class UserName(_Model):
    first_name: str
    last_name: str


class Address(_Model):
    address1: str
    address2: str
    city: str
    country: str
    state: str
    zip: str


class CreditCard(_Model):
    source: Literal["credit_card"]
    id: str
    brand: str
    last_four: str


class Paypal(_Model):
    source: Literal["paypal"]
    id: str


class GiftCard(_Model):
    source: Literal["gift_card"]
    id: str
    balance: float  # dollars


PaymentMethod = CreditCard | Paypal | GiftCard


class User(_Model):
    user_id: str
    name: UserName
    address: Address
    email: str
    payment_methods: dict[str, PaymentMethod]
    orders: list[str]


class OrderItem(_Model):
    name: str
    product_id: str
    item_id: str
    price: float  # dollars, at time of purchase
    options: dict[str, str]


class Fulfillment(_Model):
    tracking_id: list[str]
    item_ids: list[str]


class OrderPayment(_Model):
    transaction_type: Literal["payment", "refund"]
    amount: float  # dollars
    payment_method_id: str


OrderStatus = Literal[
    "processed", "pending", "pending (item modified)", "delivered", "cancelled", "exchange requested",
    "return requested"
]


class Order(_Model):
    order_id: str
    user_id: str
    address: Address
    items: list[OrderItem]
    status: OrderStatus
    fulfillments: list[Fulfillment]
    payment_history: list[OrderPayment]
    # set by the write tools; absent from db.json until then
    cancel_reason: Literal["no longer needed", "ordered by mistake"] | None = None
    exchange_items: list[str] | None = None
    exchange_new_items: list[str] | None = None
    exchange_payment_method_id: str | None = None
    exchange_price_difference: float | None = None
    return_items: list[str] | None = None
    return_payment_method_id: str | None = None


class RetailDB(_Model):
    products: dict[str, Product]  # product_id -> product
    users: dict[str, User]  # user_id -> user
    orders: dict[str, Order]  # order_id -> order

    @classmethod
    def load(cls, d: dict) -> RetailDB:
        """A fresh, independent database from a tau2 ``db.json`` dict (the dict is not modified)."""
        return cls.model_validate(d)

    def fork(self) -> RetailDB:
        """A database that shares this one's records until it writes to them: the record maps are copied (one
        entry per id), the records themselves are copied by ``RetailTools`` the first time a tool looks one up
        by id (every write goes through such a look-up), so this database is never modified. Products are
        shared (no tool writes them). Costs microseconds where ``load`` of a store with hundreds of customers
        costs a tenth of a second per episode."""
        return RetailDB.model_construct(products=self.products, users=dict(self.users), orders=dict(self.orders))

    def dump(self) -> dict:
        """The tau2 JSON form (``json.dumps(dump, indent=4)`` reproduces ``db.json`` byte for byte)."""
        return self.model_dump(exclude_none=True)


def record(obj: BaseModel) -> dict:
    """One user/order/product/variant in the tau2 JSON form."""
    return obj.model_dump(exclude_none=True)


# --- tools ----------------------------------------------------------------------------------------

_ORDER_ID = "The order id, such as '#W0000000'. Be careful there is a '#' symbol at the beginning of the order id."
_USER_ID = "The user id, such as 'sara_doe_496'."
_PAYMENT_ID = (
    "The payment method id to pay or receive refund for the item price difference, such as 'gift_card_0000000' "
    "or 'credit_card_0000000'. These can be looked up from the user or order details."
)
_STR = {"type": "string"}


def _s(desc: str) -> dict:
    return {"type": "string", "description": desc}


def _ids(desc: str) -> dict:
    return {"type": "array", "items": _STR, "description": desc}


_ADDRESS_PROPS = {
    "address1": _s("The first line of the address, such as '123 Main St'."),
    "address2": _s("The second line of the address, such as 'Apt 1' or ''."),
    "city": _s("The city, such as 'San Francisco'."),
    "state": _s("The state, such as 'CA'."),
    "country": _s("The country, such as 'USA'."),
    "zip": _s("The zip code, such as '12345'."),
}

# OpenAI function schemas of the 16 tools, in the reference's alphabetical order and wording (the paper
# profile's; ``tool_schemas(compact=True)`` gives the mini worlds' short form of the same signatures).
TOOL_SCHEMAS: list[dict] = [
    function_schema(
        "calculate",
        "Calculate the result of a mathematical expression.",
        {"expression": _s("The mathematical expression to calculate, such as '2 + 2'. The expression can contain "
                          "numbers, operators (+, -, *, /), parentheses, and spaces.")},
    ),
    function_schema(
        "cancel_pending_order",
        "Cancel a pending order. If the order is already processed or delivered, it cannot be cancelled. The agent "
        "needs to explain the cancellation detail and ask for explicit user confirmation (yes/no) to proceed. If the "
        "user confirms, the order status will be changed to 'cancelled' and the payment will be refunded. The refund "
        "will be added to the user's gift card balance immediately if the payment was made using a gift card, "
        "otherwise the refund would take 5-7 business days to process. The function returns the order details after "
        "the cancellation.",
        {"order_id": _s(_ORDER_ID),
         "reason": _s("The reason for cancellation, which should be either 'no longer needed' or 'ordered by "
                      "mistake'.")},
    ),
    function_schema(
        "exchange_delivered_order_items",
        "Exchange items in a delivered order to new items of the same product type. For a delivered order, return or "
        "exchange can be only done once by the agent. The agent needs to explain the exchange detail and ask for "
        "explicit user confirmation (yes/no) to proceed.",
        {"order_id": _s(_ORDER_ID),
         "item_ids": _ids("The item ids to be exchanged, each such as '1008292230'. There could be duplicate items "
                          "in the list."),
         "new_item_ids": _ids("The item ids to be exchanged for, each such as '1008292230'. There could be duplicate "
                              "items in the list. Each new item id should match the item id in the same position and "
                              "be of the same product."),
         "payment_method_id": _s(_PAYMENT_ID)},
    ),
    function_schema(
        "find_user_id_by_email",
        "Find user id by email. If the user is not found, the function will return an error message.",
        {"email": _s("The email of the user, such as 'something@example.com'.")},
    ),
    function_schema(
        "find_user_id_by_name_zip",
        "Find user id by first name, last name, and zip code. If the user is not found, the function will return an "
        "error message. By default, find user id by email, and only call this function if the user is not found by "
        "email or cannot remember email.",
        {"first_name": _s("The first name of the customer, such as 'John'."),
         "last_name": _s("The last name of the customer, such as 'Doe'."),
         "zip": _s("The zip code of the customer, such as '12345'.")},
    ),
    function_schema(
        "get_item_details",
        "Get the inventory details of an item.",
        {"item_id": _s("The item id, such as '6086499569'. Be careful the item id is different from the product id.")},
    ),
    function_schema("get_order_details", "Get the status and details of an order.", {"order_id": _s(_ORDER_ID)}),
    function_schema(
        "get_product_details",
        "Get the inventory details of a product.",
        {"product_id": _s("The product id, such as '6086499569'. Be careful the product id is different from the "
                          "item id.")},
    ),
    function_schema("get_user_details", "Get the details of a user, including their orders.",
                    {"user_id": _s(_USER_ID)}),
    function_schema(
        "list_all_product_types",
        "List the name and product id of all product types. Each product type has a variety of different items with "
        "unique item ids and options.",
        {},
    ),
    function_schema(
        "modify_pending_order_address",
        "Modify the shipping address of a pending order. The agent needs to explain the modification detail and ask "
        "for explicit user confirmation (yes/no) to proceed.",
        {"order_id": _s(_ORDER_ID), **_ADDRESS_PROPS},
    ),
    function_schema(
        "modify_pending_order_items",
        "Modify items in a pending order to new items of the same product type. For a pending order, this function can "
        "only be called once. The agent needs to explain the exchange detail and ask for explicit user confirmation "
        "(yes/no) to proceed.",
        {"order_id": _s(_ORDER_ID),
         "item_ids": _ids("The item ids to be modified, each such as '1008292230'. There could be duplicate items "
                          "in the list."),
         "new_item_ids": _ids("The item ids to be modified for, each such as '1008292230'. There could be duplicate "
                              "items in the list. Each new item id should match the item id in the same position and "
                              "be of the same product."),
         "payment_method_id": _s(_PAYMENT_ID)},
    ),
    function_schema(
        "modify_pending_order_payment",
        "Modify the payment method of a pending order. The agent needs to explain the modification detail and ask for "
        "explicit user confirmation (yes/no) to proceed.",
        {"order_id": _s(_ORDER_ID), "payment_method_id": _s(_PAYMENT_ID)},
    ),
    function_schema(
        "modify_user_address",
        "Modify the default address of a user. The agent needs to explain the modification detail and ask for "
        "explicit user confirmation (yes/no) to proceed.",
        {"user_id": _s(_USER_ID), **_ADDRESS_PROPS},
    ),
    function_schema(
        "return_delivered_order_items",
        "Return some items of a delivered order. The order status will be changed to 'return requested'. The agent "
        "needs to explain the return detail and ask for explicit user confirmation (yes/no) to proceed. The user will "
        "receive follow-up email for how and where to return the item.",
        {"order_id": _s(_ORDER_ID),
         "item_ids": _ids("The item ids to be returned, each such as '1008292230'. There could be duplicate items "
                          "in the list."),
         "payment_method_id": _s("The payment method id to receive the refund, such as 'gift_card_0000000' or "
                                 "'credit_card_0000000'. These can be looked up from the user or order details.")},
    ),
    function_schema(
        "transfer_to_human_agents",
        "Transfer the user to a human agent, with a summary of the user's issue. Only transfer if the user explicitly "
        "asks for a human agent, or given the policy and the available tools, you cannot solve the user's issue.",
        {"summary": _s("A summary of the user's issue.")},
    ),
]

# One line per tool for the mini worlds, whose small models see the tools in every prompt: the 16 full
# schemas are ~11k characters of JSON, the compact ones ~5.3k, of which ~4.3k is the bare signatures. A
# compact schema keeps the tool's name, parameter names, types and required list (the same signature, so
# the same calls are valid); only the prose shrinks: this one-line description, no parameter descriptions.
COMPACT_DESCRIPTIONS: dict[str, str] = {
    "calculate": "Evaluate an arithmetic expression (+ - * / and parentheses).",
    "cancel_pending_order": "Cancel a pending order. reason: 'no longer needed' or 'ordered by mistake'.",
    "exchange_delivered_order_items": "Exchange items of a delivered order for available items of the same "
                                      "product; payment_method_id pays the difference.",
    "find_user_id_by_email": "Find a user id by email.",
    "find_user_id_by_name_zip": "Find a user id by first name, last name and zip code.",
    "get_item_details": "Get an item by item id (not a product id).",
    "get_order_details": "Get an order by id (like '#W1234567').",
    "get_product_details": "Get a product and its items by product id.",
    "get_user_details": "Get a user's profile, payment methods and orders.",
    "list_all_product_types": "List all product names and product ids.",
    "modify_pending_order_address": "Change the shipping address of a pending order.",
    "modify_pending_order_items": "Change items of a pending order to available items of the same product, once "
                                  "per order; payment_method_id pays or gets the difference.",
    "modify_pending_order_payment": "Pay a pending order with another payment method.",
    "modify_user_address": "Change a user's default address.",
    "return_delivered_order_items": "Return items of a delivered order; refund to the original payment method or "
                                    "a gift card.",
    "transfer_to_human_agents": "Transfer the user to a human agent, with a summary, if the request cannot be "
                                "handled.",
}


def tool_schemas(compact: bool = False) -> list[dict]:
    """The 16 OpenAI function schemas (a fresh copy): the reference's wording, or with ``compact=True``
    the same signatures with ``COMPACT_DESCRIPTIONS`` and no parameter descriptions (mini worlds)."""
    return compact_schemas(TOOL_SCHEMAS, COMPACT_DESCRIPTIONS) if compact else json.loads(json.dumps(TOOL_SCHEMAS))


TOOL_NAMES = [s["function"]["name"] for s in TOOL_SCHEMAS]
_SCHEMA_BY_NAME = {s["function"]["name"]: s for s in TOOL_SCHEMAS}
WRITE_TOOLS = frozenset({
    "cancel_pending_order", "exchange_delivered_order_items", "modify_pending_order_address",
    "modify_pending_order_items", "modify_pending_order_payment", "modify_user_address", "return_delivered_order_items",
})


def _fold(text: str) -> str:
    """Case- and accent-insensitive form of a name or email (how the reference matches them)."""
    decomposed = unicodedata.normalize("NFKD", text)
    return "".join(c for c in decomposed if not unicodedata.combining(c)).casefold()


def _need_str(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ToolError(f"argument '{name}' must be a string")
    return value


def _need_str_list(name: str, value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ToolError(f"argument '{name}' must be a list of strings")
    return value


_BINOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.Pow: operator.pow,
}
_UNOPS: dict[type, Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def _arith(node: ast.AST) -> int | float:
    """Evaluate an arithmetic AST with Python's semantics (what the reference's ``eval`` computes).

    Only numbers, + - * / ** and unary signs; powers are bounded so that ``9**9**9`` cannot hang.
    """
    if isinstance(node, ast.Expression):
        return _arith(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNOPS:
        return _UNOPS[type(node.op)](_arith(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _arith(node.left), _arith(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 1 and abs(left) > 1 and (
                abs(right) > 10_000 or abs(right) * math.log10(abs(left)) > 4000):
            raise ToolError("Exponent too large")  # a result of over 4000 digits
        return _BINOPS[type(node.op)](left, right)
    raise ToolError("Invalid expression")


class RetailTools(Toolkit):
    """The retail desk's tools over one ``RetailDB`` (mutated in place by the write tools).

    Every public tool takes the schema's arguments as keyword arguments and returns a string (a JSON
    record for look-ups and writes). ``touched_orders`` / ``touched_users`` collect the ids a write call
    changed, so a scorer need compare only those records.
    """

    TOOLS = TOOL_SCHEMAS

    def __init__(self, db: RetailDB):
        super().__init__(db)
        self.touched_orders: set[str] = set()
        self.touched_users: set[str] = set()
        # Records this toolkit owns (copied on first look-up, so that a ``RetailDB.fork`` never writes to the
        # database it was forked from); a database of its own (``load``) pays one small copy per record used.
        self._own_orders: set[str] = set()
        self._own_users: set[str] = set()

    def call(self, name: str, arguments: dict) -> str:
        """Run one tool by name (the replay's entry point). Raises ``ToolError`` on any failure."""
        if name not in TOOL_NAMES:
            raise ToolError(f"Tool {name} not found")
        if not isinstance(arguments, dict):
            raise ToolError("arguments must be an object")
        params = list(_SCHEMA_BY_NAME[name]["function"]["parameters"]["properties"])
        missing = [p for p in params if p not in arguments]
        unexpected = [a for a in arguments if a not in params]
        if missing or unexpected:
            raise ToolError(f"{name}: missing arguments {missing}, unexpected arguments {unexpected}")
        return getattr(self, name)(**arguments)

    # --- look-ups ---
    def _order(self, order_id: Any) -> Order:
        order_id = _need_str("order_id", order_id)
        order = self.db.orders.get(order_id)
        if order is None:
            raise ToolError("Order not found")
        if order_id not in self._own_orders:
            order = self.db.orders[order_id] = order.model_copy(deep=True)
            self._own_orders.add(order_id)
        return order

    def _user(self, user_id: Any) -> User:
        user_id = _need_str("user_id", user_id)
        user = self.db.users.get(user_id)
        if user is None:
            raise ToolError("User not found")
        if user_id not in self._own_users:
            user = self.db.users[user_id] = user.model_copy(deep=True)
            self._own_users.add(user_id)
        return user

    def _product(self, product_id: Any) -> Product:
        product = self.db.products.get(_need_str("product_id", product_id))
        if product is None:
            raise ToolError("Product not found")
        return product

    def _variant(self, product_id: str, item_id: str) -> Variant:
        variant = self._product(product_id).variants.get(item_id)
        if variant is None:
            raise ToolError("Variant not found")
        return variant

    def _payment_method(self, user_id: str, payment_method_id: Any) -> PaymentMethod:
        pm = self._user(user_id).payment_methods.get(_need_str("payment_method_id", payment_method_id))
        if pm is None:
            raise ToolError("Payment method not found")
        return pm

    @staticmethod
    def _check_counts(order: Order, item_ids: list[str], message: Callable[[str], str]) -> None:
        have = [item.item_id for item in order.items]
        for item_id in item_ids:
            if item_ids.count(item_id) > have.count(item_id):
                raise ToolError(message(item_id))

    # --- read and generic tools ---
    def calculate(self, expression: str) -> str:
        expression = _need_str("expression", expression)
        if not all(c in "0123456789+-*/(). " for c in expression):
            raise ToolError("Invalid characters in expression")
        if len(expression) > 1000:  # bounds the work of a product of huge integers
            raise ToolError("Invalid expression: too long")
        try:
            value = _arith(ast.parse(expression.strip(), mode="eval"))
            return str(round(float(value), 2))
        except ToolError:
            raise
        except (SyntaxError, ValueError, TypeError, ZeroDivisionError, OverflowError, RecursionError,
                MemoryError) as exc:
            raise ToolError(f"Invalid expression: {type(exc).__name__}") from None

    def transfer_to_human_agents(self, summary: str) -> str:
        _need_str("summary", summary)
        return super().transfer_to_human_agents(summary)

    def find_user_id_by_email(self, email: str) -> str:
        wanted = _fold(_need_str("email", email))
        for user_id, user in self.db.users.items():
            if _fold(user.email) == wanted:
                return user_id
        raise ToolError("User not found")

    def find_user_id_by_name_zip(self, first_name: str, last_name: str, zip: str) -> str:
        first, last = _fold(_need_str("first_name", first_name)), _fold(_need_str("last_name", last_name))
        zip = _need_str("zip", zip)
        for user_id, user in self.db.users.items():
            if _fold(user.name.first_name) == first and _fold(user.name.last_name) == last and user.address.zip == zip:
                return user_id
        raise ToolError("User not found")

    def get_order_details(self, order_id: str) -> str:
        return json.dumps(record(self._order(order_id)))

    def get_product_details(self, product_id: str) -> str:
        return json.dumps(record(self._product(product_id)))

    def get_user_details(self, user_id: str) -> str:
        return json.dumps(record(self._user(user_id)))

    def get_item_details(self, item_id: str) -> str:
        item_id = _need_str("item_id", item_id)
        for product in self.db.products.values():
            if item_id in product.variants:
                return json.dumps(record(product.variants[item_id]))
        raise ToolError("Item not found")

    def list_all_product_types(self) -> str:
        return json.dumps({p.name: p.product_id for p in self.db.products.values()}, sort_keys=True)

    # --- write tools (all checks first, then the writes) ---
    def cancel_pending_order(self, order_id: str, reason: str) -> str:
        order = self._order(order_id)
        if order.status != "pending":
            raise ToolError("Non-pending order cannot be cancelled")
        if _need_str("reason", reason) not in ("no longer needed", "ordered by mistake"):
            raise ToolError("Invalid reason")
        methods = [self._payment_method(order.user_id, p.payment_method_id) for p in order.payment_history]
        refunds = [OrderPayment(transaction_type="refund", amount=p.amount, payment_method_id=p.payment_method_id)
                   for p in order.payment_history]
        for payment, method in zip(order.payment_history, methods):
            if isinstance(method, GiftCard):  # gift cards are refunded at once
                method.balance = round(method.balance + payment.amount, 2)
        order.status = "cancelled"
        order.cancel_reason = reason  # type: ignore[assignment]
        order.payment_history.extend(refunds)
        self.touched_orders.add(order.order_id)
        self.touched_users.add(order.user_id)
        return json.dumps(record(order))

    def _price_difference(self, order: Order, item_ids: list[str], new_item_ids: list[str],
                          refuse_same: bool) -> tuple[float, list[Variant]]:
        """Sum of new minus old prices (unrounded) and the new variants, checking each pair."""
        diff: float = 0
        variants = []
        for item_id, new_item_id in zip(item_ids, new_item_ids):
            if refuse_same and item_id == new_item_id:
                raise ToolError("The new item id should be different from the old item id")
            item = next(i for i in order.items if i.item_id == item_id)  # exists: counts were checked
            variant = self._variant(item.product_id, new_item_id)
            if not variant.available:
                raise ToolError(f"New item {new_item_id} not found or available")
            diff += variant.price - item.price
            variants.append(variant)
        return diff, variants

    def exchange_delivered_order_items(self, order_id: str, item_ids: list[str], new_item_ids: list[str],
                                       payment_method_id: str) -> str:
        order = self._order(order_id)
        if order.status != "delivered":
            raise ToolError("Non-delivered order cannot be exchanged")
        item_ids, new_item_ids = _need_str_list("item_ids", item_ids), _need_str_list("new_item_ids", new_item_ids)
        self._check_counts(order, item_ids, lambda i: f"Number of {i} not found.")
        if len(item_ids) != len(new_item_ids):
            raise ToolError("The number of items to be exchanged should match.")
        diff, _ = self._price_difference(order, item_ids, new_item_ids, refuse_same=False)
        diff = round(diff, 2)
        method = self._payment_method(order.user_id, payment_method_id)
        if isinstance(method, GiftCard) and method.balance < diff:
            raise ToolError("Insufficient gift card balance to pay for the price difference")
        order.status = "exchange requested"
        order.exchange_items = sorted(item_ids)
        order.exchange_new_items = sorted(new_item_ids)
        order.exchange_payment_method_id = payment_method_id
        order.exchange_price_difference = diff
        self.touched_orders.add(order.order_id)
        return json.dumps(record(order))

    def return_delivered_order_items(self, order_id: str, item_ids: list[str], payment_method_id: str) -> str:
        order = self._order(order_id)
        if order.status != "delivered":
            raise ToolError("Non-delivered order cannot be returned")
        method = self._payment_method(order.user_id, payment_method_id)
        original = order.payment_history[0].payment_method_id if order.payment_history else None
        if not isinstance(method, GiftCard) and payment_method_id != original:
            raise ToolError("Payment method should be the original payment method")
        item_ids = _need_str_list("item_ids", item_ids)
        self._check_counts(order, item_ids, lambda i: "Some item not found")
        order.status = "return requested"
        order.return_items = sorted(item_ids)
        order.return_payment_method_id = payment_method_id
        self.touched_orders.add(order.order_id)
        return json.dumps(record(order))

    def modify_pending_order_address(self, order_id: str, address1: str, address2: str, city: str, state: str,
                                     country: str, zip: str) -> str:
        order = self._order(order_id)
        if "pending" not in order.status:
            raise ToolError("Non-pending order cannot be modified")
        order.address = self._address(address1, address2, city, state, country, zip)
        self.touched_orders.add(order.order_id)
        return json.dumps(record(order))

    def modify_user_address(self, user_id: str, address1: str, address2: str, city: str, state: str, country: str,
                            zip: str) -> str:
        user = self._user(user_id)
        user.address = self._address(address1, address2, city, state, country, zip)
        self.touched_users.add(user.user_id)
        return json.dumps(record(user))

    @staticmethod
    def _address(address1: Any, address2: Any, city: Any, state: Any, country: Any, zip: Any) -> Address:
        fields = dict(address1=address1, address2=address2, city=city, country=country, state=state, zip=zip)
        return Address(**{k: _need_str(k, v) for k, v in fields.items()})

    def modify_pending_order_items(self, order_id: str, item_ids: list[str], new_item_ids: list[str],
                                   payment_method_id: str) -> str:
        order = self._order(order_id)
        if order.status != "pending":
            raise ToolError("Non-pending order cannot be modified")
        item_ids, new_item_ids = _need_str_list("item_ids", item_ids), _need_str_list("new_item_ids", new_item_ids)
        self._check_counts(order, item_ids, lambda i: f"{i} not found")
        if len(item_ids) != len(new_item_ids):
            raise ToolError("The number of items to be exchanged should match")
        diff, variants = self._price_difference(order, item_ids, new_item_ids, refuse_same=True)
        method = self._payment_method(order.user_id, payment_method_id)
        if isinstance(method, GiftCard) and method.balance < diff:
            raise ToolError("Insufficient gift card balance to pay for the new item")
        # The reference records the unrounded difference and, for every modified item, the price and
        # options of the *last* new variant it checked: reproduced on purpose (gold states depend on it).
        order.payment_history.append(OrderPayment(
            transaction_type="payment" if diff > 0 else "refund", amount=abs(diff),
            payment_method_id=payment_method_id))
        if isinstance(method, GiftCard):
            method.balance = round(method.balance - diff, 2)
            self.touched_users.add(order.user_id)
        last = variants[-1] if variants else None
        for item_id, new_item_id in zip(item_ids, new_item_ids):
            item = next(i for i in order.items if i.item_id == item_id)
            item.item_id = new_item_id
            if last is not None:
                item.price = last.price
                item.options = dict(last.options)
        order.status = "pending (item modified)"
        self.touched_orders.add(order.order_id)
        return json.dumps(record(order))

    def modify_pending_order_payment(self, order_id: str, payment_method_id: str) -> str:
        order = self._order(order_id)
        if "pending" not in order.status:
            raise ToolError("Non-pending order cannot be modified")
        method = self._payment_method(order.user_id, payment_method_id)
        history = order.payment_history
        if len(history) != 1 or history[0].transaction_type != "payment":
            raise ToolError("There should be exactly one payment for a pending order")
        old_id = history[0].payment_method_id
        if old_id == payment_method_id:
            raise ToolError("The new payment method should be different from the current one")
        amount = history[0].amount
        if isinstance(method, GiftCard) and method.balance < amount:
            raise ToolError("Insufficient gift card balance to pay for the order")
        old_method = self._payment_method(order.user_id, old_id)
        history.append(OrderPayment(transaction_type="payment", amount=amount, payment_method_id=payment_method_id))
        history.append(OrderPayment(transaction_type="refund", amount=amount, payment_method_id=old_id))
        if isinstance(method, GiftCard):
            method.balance = round(method.balance - amount, 2)
        if isinstance(old_method, GiftCard):
            old_method.balance = round(old_method.balance + amount, 2)
        self.touched_orders.add(order.order_id)
        self.touched_users.add(order.user_id)
        return json.dumps(record(order))


# --- gold replay ----------------------------------------------------------------------------------


def changed_records(before: RetailDB | dict, tools: RetailTools) -> tuple[dict, dict]:
    """Orders and users the calls on ``tools`` changed relative to ``before``: ({order_id: order}, {user_id: user})."""
    base = before.dump() if isinstance(before, RetailDB) else before
    orders = {oid: record(tools.db.orders[oid]) for oid in sorted(tools.touched_orders)}
    users = {uid: record(tools.db.users[uid]) for uid in sorted(tools.touched_users)}
    orders = {k: v for k, v in orders.items() if base["orders"].get(k) != v}
    users = {k: v for k, v in users.items() if base["users"].get(k) != v}
    return orders, users


def run_actions(db: RetailDB, actions: list[dict]) -> tuple[RetailTools, list[dict]]:
    """Apply ``actions`` (tau2 action dicts: name, arguments) to ``db`` in place, skipping failures.

    Returns the tools (with the touched ids) and one ``{"action_id", "index", "name", "error"}`` per action that
    raised or could not be read (not an object, no ``name``): one bad action never stops the others.
    """
    tools = RetailTools(db)
    failures = []
    for i, action in enumerate(actions):
        if not isinstance(action, dict):
            failures.append({"action_id": None, "index": i, "name": None,
                             "error": f"action must be an object, got {type(action).__name__}"})
            continue
        name = action.get("name")
        try:
            if not isinstance(name, str) or not name:
                raise ToolError("action has no 'name' string")
            tools.call(name, action.get("arguments") or {})
        except ToolError as exc:
            error = str(exc)
        except Exception as exc:  # a malformed gold action is reported, never fatal
            error = f"{type(exc).__name__}: {exc}"
        else:
            continue
        failures.append({"action_id": action.get("action_id"), "index": i,
                         "name": name if isinstance(name, str) else None, "error": error})
    return tools, failures


def failure_keys(failures: list[dict]) -> list[str]:
    """One distinct key per failure: its ``action_id``, or ``#<index>`` (position in the action list) when the
    id is missing, not a string, or shared with another action of the task (so no error overwrites another)."""
    ids = [f["action_id"] for f in failures]
    keys = []
    for f in failures:
        aid = f["action_id"]
        ok = isinstance(aid, str) and aid and ids.count(aid) == 1 and not aid.startswith("#")
        keys.append(aid if ok else f"#{f['index']}")
    return keys


def replay(db_dict: dict, task_dict: dict) -> dict:
    """Replay one tau2 task's gold actions on a fresh copy of ``db_dict``.

    Returns ``{"id", "failing_actions": [key, ...], "errors": {key: message}, "orders": {...}, "users": {...}}``:
    the orders and users (tau2 JSON records) the gold actions changed. A failing action's key is its
    ``action_id``, or ``#<index>`` when that id is missing or repeated (``failure_keys``). A task whose action
    list cannot be read (not a list) gets the record with an ``"error"`` entry and nothing replayed.
    """
    if not isinstance(task_dict, dict):
        return {"id": None, "failing_actions": [], "errors": {}, "orders": {}, "users": {},
                "error": f"task must be an object, got {type(task_dict).__name__}"}
    criteria = task_dict.get("evaluation_criteria") or {}
    actions = criteria.get("actions") if isinstance(criteria, dict) else criteria
    if actions is None:
        actions = []
    problem = None
    if not isinstance(criteria, dict):
        problem = f"evaluation_criteria must be an object, got {type(criteria).__name__}"
    elif not isinstance(actions, list):
        problem = f"evaluation_criteria.actions must be a list, got {type(actions).__name__}"
    if problem:
        return {"id": task_dict.get("id"), "failing_actions": [], "errors": {}, "orders": {}, "users": {},
                "error": problem}
    tools, failures = run_actions(RetailDB.load(db_dict), actions)
    orders, users = changed_records(db_dict, tools)
    keys = failure_keys(failures)
    return {
        "id": task_dict.get("id"),
        "failing_actions": keys,
        "errors": {k: f["error"] for k, f in zip(keys, failures)},
        "orders": orders,
        "users": users,
    }
