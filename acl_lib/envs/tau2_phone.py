"""The customer's phone in tau2-bench's telecom domain: its state, the rules for what it shows, and its 30 tools.

In tau2's telecom tasks most of the repair happens on the customer's own phone: the agent diagnoses by asking the
customer to look at the status bar or run a speed test, and tells them what to switch. The customer (the LLM user
simulator, ``llm_user.LLMUser`` with tools) does it through the tools here, and the task is scored by assertions on
the phone's final state (``assert_*``). This module is our implementation of the behaviour of tau2's
``user_data_model.py`` / ``user_tools.py`` (read from tau2-bench, not copied); the agent's side is in
``tau2_telecom.py``.

State (``user_db.toml``, a JSON dict ``{"device": {...}, "surroundings": {...}}``, missing fields take tau2's
defaults, ``DEFAULT_DEVICE`` / ``DEFAULT_SURROUNDINGS``):

- ``device``: SIM (``sim_card_status``: active / missing / locked_pin / locked_puk, ``sim_card_missing``), airplane
  mode, the cellular connection (status, technology, signal), battery, mobile data, data roaming, the preferred
  network mode, the active APN settings (name ``internet`` or ``broken``, MMSC URL, ``reset_at_reboot``), Wi-Fi,
  Wi-Fi calling (and MMS over Wi-Fi), data saver, VPN (setting, connection, details with a server performance), and
  the installed apps with their permissions (sms, storage, phone, network).
- ``surroundings``: what the phone cannot change: the user's name and number, whether they are abroad, whether the
  carrier lets the line roam, the signal per technology where they are, whether the data allowance is used up,
  whether the line is active, and the pending payment request. The agent's database sets the carrier's part of it
  after every tool call (``tau2_telecom.TelecomWorld.sync``).

The rules (``Phone``): a network search sets the connection from the SIM, the preferred mode and the local signal,
and airplane mode, a broken APN or an inactive line leave no service; mobile data works unless airplane mode is on,
there is no signal or service, the user is abroad without roaming on both the phone and the line, data is off, or
the allowance is used up; the speed test scales the technology's typical speed by the signal, a poorly performing
VPN (x0.1) and data saver (x0.2); MMS needs working mobile data, 3G or better, no MMS-over-Wi-Fi calling, an MMSC
URL and the messaging app's sms and storage permissions.

Tools the customer may call are listed in ``PHONE_TOOLS`` (OpenAI schemas). ``PhoneTools`` also has the functions
tau2's tasks use to break the phone before the conversation (``turn_airplane_mode_on``, ``unseat_sim_card``,
``break_apn_settings``, ...; never offered to the simulator) and the assertions of the evaluation criteria.
"""

from __future__ import annotations

import copy
from typing import Any

from acl_lib.envs.base import ToolError, function_schema
from acl_lib.envs.desk import Toolkit

SIM_STATES = ("active", "missing", "locked_pin", "locked_puk")
TECHNOLOGIES = ("none", "2G", "3G", "4G", "5G")
NETWORK_MODES = ("4g_5g_preferred", "4g_only", "3g_only", "2g_only")
SIGNALS = ("none", "poor", "fair", "good", "excellent")
SERVICE_STATES = ("connected", "searching", "no_service", "emergency_only")
PERMISSIONS = ("sms", "storage", "phone", "network")

DEFAULT_APN = {"apn_name": "internet", "reset_at_reboot": False, "mms_apn": "mms",
               "mmsc_url": "http://mms.carrier.com/mms/wapenc", "mms_proxy": None, "mms_port": None}
DEFAULT_DEVICE: dict[str, Any] = {
    "sim_card_status": "active", "sim_card_missing": False, "airplane_mode": False,
    "network_signal_strength": "good", "network_technology_connected": "5G", "network_connection_status": "connected",
    "battery_level": 80, "data_enabled": True, "roaming_enabled": False, "network_mode_preference": "4g_5g_preferred",
    "active_apn_settings": DEFAULT_APN,
    "wifi_enabled": False, "wifi_connected": False, "wifi_ssid": None, "wifi_signal_strength": "none",
    "wifi_calling_enabled": False, "wifi_calling_mms_over_wifi": False, "data_saver_mode": False,
    "vpn_enabled_setting": False, "vpn_connected": False, "vpn_details": None,
    "app_statuses": {
        "messaging": {"app_name": "messaging",
                      "permissions": {"sms": True, "storage": True, "phone": True, "network": False}},
        "browser": {"app_name": "browser",
                    "permissions": {"sms": False, "storage": True, "phone": False, "network": True}},
    },
}
DEFAULT_SURROUNDINGS: dict[str, Any] = {
    "name": None, "phone_number": None, "is_abroad": False, "roaming_allowed": False,
    "signal_strength": {"2G": "poor", "3G": "fair", "4G": "good", "5G": "excellent"},
    "mobile_data_usage_exceeded": False, "line_active": True, "payment_request": None,
}
# What connect_vpn connects to (tau2's default VPN); break_vpn makes its server slow.
DEFAULT_VPN = {"server_address": "192.168.1.1", "protocol": "OpenVPN", "server_performance": "excellent"}

# Typical download speed per technology (Mbps, low and high end) and the share of it each signal level gives.
SPEED_RANGE = {"2G": (0.1, 0.4), "3G": (1.0, 5.0), "4G": (10.0, 100.0), "5G": (50.0, 500.0), "none": (0.0, 0.0)}
SIGNAL_FACTOR = {"none": 0.0, "poor": 0.2, "fair": 0.5, "good": 0.8, "excellent": 1.0}
SIGNAL_BARS = {"none": "no signal", "poor": "1 bar (poor)", "fair": "2 bars (fair)", "good": "3 bars (good)",
               "excellent": "4 bars (excellent)"}


def _merge(base: dict, update: dict, where: str) -> dict:
    """``base`` updated with ``update`` recursively (nested dicts merged, other values replaced); an unknown key of a
    fixed record raises ``ValueError`` naming it (``app_statuses`` may gain new apps)."""
    out = copy.deepcopy(base)
    for key, value in (update or {}).items():
        if key not in out and where not in ("device.app_statuses", "surroundings.signal_strength"):
            raise ValueError(f"{where}: unknown field '{key}' (fields: {', '.join(sorted(out))})")
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value, f"{where}.{key}")
        else:
            out[key] = copy.deepcopy(value)
    return out


def phone_db(user_db: dict | None = None) -> dict:
    """A complete phone state from a (partial) ``user_db.toml`` dict: every field the rules read, tau2's defaults for
    the missing ones. A new app listed in ``device.app_statuses`` gets every permission off unless given."""
    user_db = user_db or {}
    unknown = set(user_db) - {"device", "surroundings"}
    if unknown:
        raise ValueError(f"user_db: unknown table(s) {sorted(unknown)} (expected device, surroundings)")
    device = _merge(DEFAULT_DEVICE, {k: v for k, v in (user_db.get("device") or {}).items() if k != "app_statuses"},
                    "device")
    apps = user_db.get("device", {}).get("app_statuses")
    if apps is not None:  # the file's apps replace the default ones
        device["app_statuses"] = {
            name: {"app_name": app.get("app_name", name),
                   "permissions": _merge(dict.fromkeys(PERMISSIONS, False), app.get("permissions") or {},
                                         f"device.app_statuses.{name}.permissions")}
            for name, app in apps.items()}
    return {"device": device, "surroundings": _merge(DEFAULT_SURROUNDINGS, user_db.get("surroundings") or {},
                                                     "surroundings")}


def _on_off(flag: bool) -> str:
    return "ON" if flag else "OFF"


# --- the customer's tools ---------------------------------------------------------------------------------------

_APP = {"app_name": {"type": "string", "description": "The app's name as installed, e.g. messaging."}}
PHONE_TOOLS: list[dict] = [
    function_schema("check_status_bar", "Look at the icons at the top of your screen: signal bars, network type, "
                    "mobile data, data saver, Wi-Fi, VPN, airplane mode and battery.", {}),
    function_schema("check_network_status", "Open the connection settings: airplane mode, SIM, cellular connection, "
                    "signal, network type, mobile data, data roaming and Wi-Fi.", {}),
    function_schema("check_network_mode_preference", "See which network type your phone prefers (e.g. 4G/5G).", {}),
    function_schema("set_network_mode_preference", "Choose the network type your phone prefers; faster types (4G/5G) "
                    "give faster data.",
                    {"mode": {"type": "string", "description": f"One of: {', '.join(NETWORK_MODES)}."}}),
    function_schema("run_speed_test", "Measure your mobile internet download speed.", {}),
    function_schema("toggle_airplane_mode", "Switch airplane mode on or off (on cuts every radio: cellular, Wi-Fi).",
                    {}),
    function_schema("check_sim_status", "See whether your SIM card is working, missing or locked (PIN/PUK).", {}),
    function_schema("reseat_sim_card", "Take the SIM card out and put it back in.", {}),
    function_schema("toggle_data", "Switch mobile data on or off.", {}),
    function_schema("toggle_roaming", "Switch data roaming on or off (needed for data abroad).", {}),
    function_schema("check_data_restriction_status", "See whether data saver mode is limiting your data.", {}),
    function_schema("toggle_data_saver_mode", "Switch data saver mode on or off (on slows data down).", {}),
    function_schema("check_apn_settings", "See your APN settings (the technical settings for mobile data and picture "
                    "messages).", {}),
    function_schema("set_apn_settings", "Replace your APN settings with the ones given.",
                    {"apn_settings": {"type": "object", "description": "APN fields: apn_name, mmsc_url, mms_apn, "
                                      "mms_proxy, mms_port, reset_at_reboot."}}),
    function_schema("reset_apn_settings", "Reset your APN settings to the carrier's defaults (applied at the next "
                    "reboot).", {}),
    function_schema("check_wifi_status", "See whether Wi-Fi is on and which network you are connected to.", {}),
    function_schema("toggle_wifi", "Switch Wi-Fi on or off.", {}),
    function_schema("check_wifi_calling_status", "See whether Wi-Fi calling is on.", {}),
    function_schema("toggle_wifi_calling", "Switch Wi-Fi calling on or off.", {}),
    function_schema("check_vpn_status", "See whether a VPN is on and connected, with its details.", {}),
    function_schema("connect_vpn", "Connect your VPN.", {}),
    function_schema("disconnect_vpn", "Disconnect your VPN.", {}),
    function_schema("check_installed_apps", "List the apps installed on your phone.", {}),
    function_schema("check_app_status", "See an app's status and the permissions it has.", dict(_APP)),
    function_schema("check_app_permissions", "See which permissions an app has.", dict(_APP)),
    function_schema("grant_app_permission", "Give an app a permission.",
                    {**_APP, "permission": {"type": "string", "description": f"One of: {', '.join(PERMISSIONS)} "
                                            "(lowercase)."}}),
    function_schema("can_send_mms", "Try whether your messaging app can send a picture message (MMS).", {}),
    function_schema("reboot_device", "Restart your phone.", {}),
    function_schema("check_payment_request", "See whether the agent has sent you a payment request.", {}),
    function_schema("make_payment", "Pay the bill of the payment request the agent sent you.", {}),
]


class PhoneTools(Toolkit):
    """The customer's phone (``db`` = ``phone_db(...)``, mutated in place) and what they can do with it.

    Every tool returns the text the customer sees; a write also shows the status bar after it. Nothing here raises
    on a bad value the customer chose (an unknown app or network mode is an answer saying so); ``ToolError`` only
    for arguments that are not even of the right shape.
    """

    TOOLS = PHONE_TOOLS

    @property
    def device(self) -> dict:
        return self.db["device"]

    @property
    def surroundings(self) -> dict:
        return self.db["surroundings"]

    # --- the rules -------------------------------------------------------------------------------------------------

    def sim_status(self) -> str:
        return "missing" if self.device["sim_card_missing"] else self.device["sim_card_status"]

    def network_search(self) -> None:
        """Re-read the network, as the phone does after a setting changes: connected on the preferred technology at
        the local signal when the SIM is active, else no service; airplane mode, a broken APN or an inactive line
        leave no service whatever the SIM."""
        d, s = self.device, self.surroundings
        if self.sim_status() == "active":
            mode = d["network_mode_preference"]
            if mode == "4g_5g_preferred":
                tech = "5G" if s["signal_strength"].get("5G", "none") != "none" else "4G"
            else:
                tech = {"4g_only": "4G", "3g_only": "3G", "2g_only": "2G"}.get(mode, "4G")
            d["network_connection_status"] = "connected"
            d["network_technology_connected"] = tech
            d["network_signal_strength"] = s["signal_strength"].get(tech, "none")
        else:
            self._no_service()
        if d["airplane_mode"] or d["active_apn_settings"]["apn_name"] == "broken" or not s["line_active"]:
            self._no_service()

    def _no_service(self) -> None:
        self.device.update(network_connection_status="no_service", network_technology_connected="none",
                           network_signal_strength="none")

    def mobile_data_working(self) -> bool:
        d, s = self.device, self.surroundings
        if (d["airplane_mode"] or d["network_signal_strength"] == "none"
                or d["network_connection_status"] == "no_service"):
            return False
        if s["is_abroad"] and not (d["roaming_enabled"] and s["roaming_allowed"]):
            return False
        return bool(d["data_enabled"]) and not s["mobile_data_usage_exceeded"]

    def speed(self) -> tuple[float | None, str]:
        """(download speed in Mbps, its grade), or (None, why) when mobile data does not work."""
        if not self.mobile_data_working():
            return None, "No Connection"
        d = self.device
        factor = 1.0
        if d["vpn_connected"] and (d["vpn_details"] or {}).get("server_performance") == "poor":
            factor = 0.1
        if d["data_saver_mode"]:
            factor *= 0.2
        lo, hi = SPEED_RANGE.get(d["network_technology_connected"], (0.0, 0.0))
        mbps = round((lo + hi) / 2.0 * SIGNAL_FACTOR.get(d["network_signal_strength"], 0.0) * factor, 2)
        grade = ("Very Poor" if mbps < 1 else "Poor" if mbps < 5 else "Fair" if mbps < 25 else "Good" if mbps < 100
                 else "Excellent")
        return mbps, grade

    def mms_works(self) -> bool:
        d = self.device
        if not self.mobile_data_working() or d["network_technology_connected"] == "2G":
            return False
        if d["wifi_calling_enabled"] and d["wifi_calling_mms_over_wifi"]:  # the carrier does not carry MMS over Wi-Fi
            return False
        if not d["active_apn_settings"].get("mmsc_url"):
            return False
        app = d["app_statuses"].get("messaging")
        return bool(app and app["permissions"].get("sms") and app["permissions"].get("storage"))

    def status_bar(self) -> str:
        d = self.device
        parts = []
        if d["airplane_mode"]:
            parts.append("airplane mode")
        else:
            parts.append(SIGNAL_BARS.get(d["network_signal_strength"], "no signal"))
            tech = d["network_technology_connected"]
            if tech != "none":
                parts.append(tech)
            if d["data_enabled"] and tech != "none":
                parts.append("mobile data on" + (", data saver on" if d["data_saver_mode"] else ""))
            else:
                parts.append("mobile data off")
        if d["wifi_enabled"] and d["wifi_connected"]:
            parts.append(f"Wi-Fi: {d['wifi_ssid']}" if d["wifi_ssid"] else "Wi-Fi on")
        if d["vpn_connected"]:
            parts.append("VPN connected")
        parts.append(f"battery {d['battery_level']}%")
        return "Status bar: " + " | ".join(parts)

    def _after(self, text: str) -> str:
        return f"{text}\n{self.status_bar()}"

    # --- reads ------------------------------------------------------------------------------------------------------

    def check_status_bar(self) -> str:
        return self.status_bar()

    def check_network_status(self) -> str:
        d = self.device
        lines = [f"Airplane mode: {_on_off(d['airplane_mode'])}", f"SIM card: {self.sim_status()}",
                 f"Cellular connection: {d['network_connection_status']}", f"Signal: {d['network_signal_strength']}",
                 f"Network type: {d['network_technology_connected']}",
                 f"Mobile data: {_on_off(d['data_enabled'])}", f"Data roaming: {_on_off(d['roaming_enabled'])}",
                 f"Wi-Fi: {_on_off(d['wifi_enabled'])}, {'connected' if d['wifi_connected'] else 'not connected'}"]
        if d["wifi_connected"]:
            lines.append(f"Wi-Fi network: {d['wifi_ssid']}")
        return "\n".join(lines)

    def check_network_mode_preference(self) -> str:
        return f"Preferred network mode: {self.device['network_mode_preference']}"

    def run_speed_test(self) -> str:
        mbps, grade = self.speed()
        if mbps is None:
            return f"Speed test failed: {grade.lower()}."
        return f"Speed test: {mbps:.2f} Mbps download ({grade})."

    def check_sim_status(self) -> str:
        messages = {"active": "The SIM card is active and working.", "missing": "No SIM card is detected.",
                    "locked_pin": "The SIM card is locked and asks for its PIN.",
                    "locked_puk": "The SIM card is locked and asks for its PUK code."}
        return messages.get(self.sim_status(), f"SIM status: {self.sim_status()}")

    def check_data_restriction_status(self) -> str:
        return f"Data saver mode is {_on_off(self.device['data_saver_mode'])}."

    def check_apn_settings(self) -> str:
        apn = self.device["active_apn_settings"]
        return (f"APN name: {apn.get('apn_name') or 'not set'}\nMMSC URL (picture messages): "
                f"{apn.get('mmsc_url') or 'not set'}")

    def check_wifi_status(self) -> str:
        d = self.device
        if not d["wifi_enabled"]:
            return "Wi-Fi is OFF."
        if d["wifi_connected"]:
            return f"Wi-Fi is ON, connected to '{d['wifi_ssid']}' (signal {d['wifi_signal_strength']})."
        return "Wi-Fi is ON and not connected to any network."

    def check_wifi_calling_status(self) -> str:
        return f"Wi-Fi calling is {_on_off(self.device['wifi_calling_enabled'])}."

    def check_vpn_status(self) -> str:
        d = self.device
        if d["vpn_connected"]:
            return f"VPN is connected: {d['vpn_details']}" if d["vpn_details"] else "VPN is connected."
        return "VPN is on in settings but not connected." if d["vpn_enabled_setting"] else "VPN is OFF."

    def check_installed_apps(self) -> str:
        return "Installed apps: " + ", ".join(self.device["app_statuses"])

    def _app(self, app_name: str) -> dict | None:
        if not isinstance(app_name, str):
            raise ToolError(f"app_name must be a string, got {type(app_name).__name__}")
        return self.device["app_statuses"].get(app_name)

    def _granted(self, app: dict) -> list[str]:
        return [p for p, on in app["permissions"].items() if on]

    def check_app_status(self, app_name: str) -> str:
        app = self._app(app_name)
        if app is None:
            return f"There is no app '{app_name}' on this phone."
        granted = self._granted(app)
        return f"App {app_name}: permissions granted: {', '.join(granted) if granted else 'none'}."

    def check_app_permissions(self, app_name: str) -> str:
        app = self._app(app_name)
        if app is None:
            return f"There is no app '{app_name}' on this phone."
        granted = self._granted(app)
        return f"App '{app_name}' has permission for: {', '.join(granted)}." if granted else \
            f"App '{app_name}' has no permissions."

    def can_send_mms(self) -> str:
        return "The picture message was sent (MMS works)." if self.mms_works() else \
            "The picture message could not be sent (MMS does not work)."

    def check_payment_request(self) -> str:
        req = self.surroundings["payment_request"]
        if req is None:
            return "There is no payment request."
        return f"Payment request for bill {req['bill_id']}: {req['amount_due']} USD."

    # --- writes -----------------------------------------------------------------------------------------------------

    def set_network_mode_preference(self, mode: str) -> str:
        if mode not in NETWORK_MODES:
            return self._after(f"'{mode}' is not a network mode; the modes are: {', '.join(NETWORK_MODES)}.")
        self.device["network_mode_preference"] = mode
        self.network_search()
        return self._after(f"Preferred network mode is now {mode}.")

    def _airplane(self) -> bool:
        d = self.device
        was_on = d["airplane_mode"]
        d["airplane_mode"] = not was_on
        if was_on:
            d["network_connection_status"] = "searching"
        if not was_on or d["wifi_enabled"]:  # turning it on, or off with Wi-Fi on: Wi-Fi starts disconnected
            d.update(wifi_connected=False, wifi_ssid=None, wifi_signal_strength="none")
        if not was_on and d["vpn_connected"]:
            self._vpn_off()
        self.network_search()
        return d["airplane_mode"]

    def toggle_airplane_mode(self) -> str:
        return self._after(f"Airplane mode is now {_on_off(self._airplane())}.")

    def reseat_sim_card(self) -> str:
        self.device["sim_card_missing"] = False
        self.network_search()
        return self._after("The SIM card was taken out and put back in.")

    def toggle_data(self) -> str:
        self.device["data_enabled"] = not self.device["data_enabled"]
        self.network_search()
        return self._after(f"Mobile data is now {_on_off(self.device['data_enabled'])}.")

    def toggle_roaming(self) -> str:
        self.device["roaming_enabled"] = not self.device["roaming_enabled"]
        self.network_search()
        return self._after(f"Data roaming is now {_on_off(self.device['roaming_enabled'])}.")

    def toggle_data_saver_mode(self) -> str:
        self.device["data_saver_mode"] = not self.device["data_saver_mode"]
        return self._after(f"Data saver mode is now {_on_off(self.device['data_saver_mode'])}.")

    def set_apn_settings(self, apn_settings: dict) -> str:
        try:
            apn = _merge(DEFAULT_APN, apn_settings, "apn_settings")
        except ValueError as exc:
            raise ToolError(str(exc)) from None
        if apn["apn_name"] not in ("internet", "broken"):
            raise ToolError(f"apn_settings.apn_name must be 'internet' or 'broken', got {apn['apn_name']!r}")
        self.device["active_apn_settings"] = apn
        self.network_search()
        return self._after(f"APN settings set to {apn['apn_name']}.")

    def reset_apn_settings(self) -> str:
        self.device["active_apn_settings"]["reset_at_reboot"] = True
        self.network_search()
        return self._after("The APN settings will be reset to the defaults at the next reboot.")

    def toggle_wifi(self) -> str:
        d = self.device
        if d["airplane_mode"]:
            return self._after("Wi-Fi cannot be changed while airplane mode is ON.")
        d["wifi_enabled"] = not d["wifi_enabled"]
        if not d["wifi_enabled"]:
            d.update(wifi_connected=False, wifi_ssid=None, wifi_signal_strength="none")
        return self._after(f"Wi-Fi is now {_on_off(d['wifi_enabled'])}.")

    def toggle_wifi_calling(self) -> str:
        self.device["wifi_calling_enabled"] = not self.device["wifi_calling_enabled"]
        return self._after(f"Wi-Fi calling is now {_on_off(self.device['wifi_calling_enabled'])}.")

    def connect_vpn(self) -> str:
        if self.device["vpn_connected"]:
            return "The VPN is already connected."
        self.device.update(vpn_connected=True, vpn_details=dict(DEFAULT_VPN))
        return self._after("VPN connected.")

    def _vpn_off(self) -> bool:
        if not self.device["vpn_connected"]:
            return False
        self.device.update(vpn_connected=False, vpn_details=None)
        return True

    def disconnect_vpn(self) -> str:
        return self._after("VPN disconnected." if self._vpn_off() else "There is no VPN connection to disconnect.")

    def grant_app_permission(self, app_name: str, permission: str) -> str:
        app = self._app(app_name)
        if app is None:
            return self._after(f"There is no app '{app_name}' on this phone.")
        perm = str(permission).lower()
        if perm not in app["permissions"]:
            return self._after(f"'{permission}' is not a permission of {app_name} (permissions: "
                               f"{', '.join(app['permissions'])}).")
        app["permissions"][perm] = True
        return self._after(f"{app_name} now has the {perm} permission.")

    def reboot_device(self) -> str:
        said = []
        if self.device["active_apn_settings"].get("reset_at_reboot"):
            self.device["active_apn_settings"] = copy.deepcopy(DEFAULT_APN)
            said.append("APN settings reset to the defaults.")
        self.device["network_connection_status"] = "searching"
        self.network_search()
        return self._after(" ".join(said + ["The phone restarted."]))

    def make_payment(self) -> str:
        req = self.surroundings["payment_request"]
        if req is None:
            return "There is no payment request to pay."
        req["paid"] = True
        return f"Paid {req['amount_due']} USD for bill {req['bill_id']}."

    # --- the tasks' set-up functions (never offered to the customer) -------------------------------------------------

    def set_user_info(self, name: str, phone_number: str) -> str:
        self.surroundings.update(name=name, phone_number=phone_number)
        return f"user {name}, {phone_number}"

    def set_user_location(self, abroad: bool) -> str:
        self.surroundings["is_abroad"] = bool(abroad)
        return f"abroad: {bool(abroad)}"

    def simulate_network_search(self) -> str:
        self.network_search()
        return self.status_bar()

    def turn_airplane_mode_on(self) -> str:
        if not self.device["airplane_mode"]:
            self._airplane()
        return "airplane mode on"

    def turn_airplane_mode_off(self) -> str:
        if self.device["airplane_mode"]:
            self._airplane()
        return "airplane mode off"

    def unseat_sim_card(self) -> str:
        self.device["sim_card_missing"] = True
        self.network_search()
        return "SIM card removed"

    def lock_sim_card(self, mode: str) -> str:
        if mode not in ("pin", "puk"):
            raise ValueError(f"lock_sim_card: mode must be 'pin' or 'puk', got {mode!r}")
        self.device["sim_card_status"] = f"locked_{mode}"
        self.network_search()
        return f"SIM locked ({mode})"

    def turn_data_on(self) -> str:
        self.device["data_enabled"] = True  # tau2 sets it without a network search
        return "mobile data on"

    def turn_data_off(self) -> str:
        if self.device["data_enabled"]:
            self.device["data_enabled"] = False
        self.network_search()
        return "mobile data off"

    def turn_roaming_on(self) -> str:
        self.device["roaming_enabled"] = True
        self.network_search()
        return "roaming on"

    def turn_roaming_off(self) -> str:
        self.device["roaming_enabled"] = False
        self.network_search()
        return "roaming off"

    def turn_data_saver_mode_on(self) -> str:
        self.device["data_saver_mode"] = True
        return "data saver on"

    def turn_data_saver_mode_off(self) -> str:
        self.device["data_saver_mode"] = False
        return "data saver off"

    def break_apn_settings(self) -> str:
        self.device["active_apn_settings"]["apn_name"] = "broken"
        self.network_search()
        return "APN broken"

    def break_apn_mms_setting(self) -> str:
        self.device["active_apn_settings"]["mmsc_url"] = None
        return "MMSC URL removed"

    def break_vpn(self) -> str:
        if not self.device["vpn_connected"] or not self.device["vpn_details"]:
            self.device.update(vpn_connected=True, vpn_details=dict(DEFAULT_VPN))
        self.device["vpn_details"]["server_performance"] = "poor"
        return "VPN slowed down"

    def set_wifi_calling(self, enabled: bool, mms_over_wifi: bool | None = None) -> str:
        self.device["wifi_calling_enabled"] = bool(enabled)
        if mms_over_wifi is not None:
            self.device["wifi_calling_mms_over_wifi"] = bool(mms_over_wifi)
        return f"Wi-Fi calling {_on_off(enabled)}"

    def remove_app_permission(self, app_name: str, permission: str) -> str:
        app = self._app(app_name)
        if app is None or str(permission).lower() not in app["permissions"]:
            raise ValueError(f"remove_app_permission: no permission {permission!r} on app {app_name!r}")
        app["permissions"][str(permission).lower()] = False
        return f"{permission} removed from {app_name}"

    # --- assertions (tau2's evaluation criteria on the phone) --------------------------------------------------------

    def assert_airplane_mode_status(self, expected_status: bool) -> bool:
        return self.device["airplane_mode"] == expected_status

    def assert_service_status(self, expected_status: str) -> bool:
        if expected_status not in SERVICE_STATES:
            raise ValueError(f"assert_service_status: unknown status {expected_status!r} ({', '.join(SERVICE_STATES)})")
        return self.device["network_connection_status"] == expected_status

    def assert_mobile_data_status(self, expected_status: bool) -> bool:
        return self.mobile_data_working() == expected_status

    def assert_mobile_roaming_status(self, expected_status: bool) -> bool:
        return self.device["roaming_enabled"] == expected_status

    def assert_mobile_data_saver_mode_status(self, expected_status: bool) -> bool:
        return self.device["data_saver_mode"] == expected_status

    def assert_internet_speed(self, expected_speed: float, expected_desc: str | None = None) -> bool:
        mbps, grade = self.speed()
        fast = (mbps or 0.0) >= expected_speed
        return fast if expected_desc is None else fast and grade.lower() == str(expected_desc).lower()

    def assert_internet_not_excellent(self) -> bool:
        return self.speed()[1].lower() != "excellent"

    def assert_can_send_mms(self, expected_status: bool) -> bool:
        return self.mms_works() == expected_status

    def assert_mobile_data_usage_exceeded(self, expected_status: bool) -> bool:
        return self.surroundings["mobile_data_usage_exceeded"] == expected_status
